"""The API keys of servers, by the server's address: in the system keyring (the keyring package),
or, where there is none to use (keyring's fail backend, or any keyring error: no Secret Service, a
locked one), in a file only the user can read (mode 0600, in the app's config folder). Never in
the settings, which sit in a database any process of the user may read and a backup may copy.

The calls may block (a keyring can ask to be unlocked): the window makes them off its thread."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import platformdirs

SERVICE = "kwker"  # the keyring's service name; the user name is the server's address
KEY_FILE = "server-keys.json"
KEYRING, FILE = "keyring", "file"  # where save_key put a key


def key_file() -> Path:
    """The fallback file (XDG_CONFIG_HOME moves it on Linux, as it moves every app's config)."""
    return Path(platformdirs.user_config_dir("kwker")) / KEY_FILE


def _keyring():
    """The system keyring, or None where there is none to use."""
    try:
        import keyring
        from keyring.backends import fail

        backend = keyring.get_keyring()
    except Exception:  # noqa: BLE001  (a broken keyring install: the file will do)
        traceback.print_exc()
        return None
    return None if isinstance(backend, fail.Keyring) else backend


def _read_file() -> dict[str, str]:
    try:
        keys = json.loads(key_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return keys if isinstance(keys, dict) else {}


def _write_file(keys: dict[str, str]) -> None:
    """Writes keys to the file atomically; the new file is created 0600, never readable by others
    even for a moment (a chmod after the write would leave a window)."""
    path = key_file()
    if not keys:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(keys, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def save_key(server: str, key: str) -> str:
    """Keeps server's key; returns where: KEYRING or FILE."""
    backend = _keyring()
    if backend is not None:
        try:
            backend.set_password(SERVICE, server, key)
        except Exception:  # noqa: BLE001  (locked, refused, no D-Bus: fall back to the file)
            traceback.print_exc()
        else:
            _forget_in_file(server)  # no second, stale copy
            return KEYRING
    keys = _read_file()
    keys[server] = key
    _write_file(keys)
    return FILE


def load_key(server: str) -> str | None:
    """server's key, or None when none is kept."""
    backend = _keyring()
    if backend is not None:
        try:
            key = backend.get_password(SERVICE, server)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            key = None
        if key:
            return key
    return _read_file().get(server) or None


def delete_key(server: str) -> None:
    """Forgets server's key wherever it is kept."""
    backend = _keyring()
    if backend is not None:
        try:
            if backend.get_password(SERVICE, server) is not None:
                backend.delete_password(SERVICE, server)
        except Exception:  # noqa: BLE001  (nothing to delete, or a keyring error: the file still)
            traceback.print_exc()
    _forget_in_file(server)


def _forget_in_file(server: str) -> None:
    keys = _read_file()
    if server in keys:
        del keys[server]
        _write_file(keys)
