"""API keys, read one way for the server and its clients.

A key file holds one key a line, optionally after a name ("alice KEY"); blank lines and lines
starting with "#" are skipped. `kwker serve` takes every key in it (each a tenant of its own);
a client (`kwker generate --server`) sends the first. Without a file, KWKER_API_KEY is the key."""

from __future__ import annotations

import os
import sys

ENV = "KWKER_API_KEY"


def api_key_from(key_file: str | None, key: str | None) -> str | dict[str, str] | None:
    """The key a server requires: from --api-key-file, else KWKER_API_KEY, else --api-key (which
    every user of the machine can read in `ps`: a warning says so). A file may hold several keys,
    one a line, each optionally after a name ("alice KEY"; "#" starts a comment): then the
    result is {key: name}, and each key is a tenant of its own (see ServingEngine.submit)."""
    if key_file:
        keys = read_key_file(key_file)
        if len(keys) == 1 and next(iter(keys.values())) == "":
            return next(iter(keys))  # one key without a name
        return {key: name or f"key {i + 1}" for i, (key, name) in enumerate(keys.items())}
    if os.environ.get(ENV):
        return os.environ[ENV]
    if key:
        print(
            "kwker serve: warning: --api-key shows the key to every user of this machine (in "
            "`ps`); use --api-key-file or KWKER_API_KEY",
            file=sys.stderr,
        )
    return key


def read_key_file(path: str) -> dict[str, str]:
    """{key: name ("" for none)} of an API key file: one key a line, optionally after a name
    ("alice KEY"); blank lines and lines starting with "#" are skipped. The server takes every
    key (api_key_from), a client the first (kwker generate --server)."""
    with open(path, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f.read().splitlines()]
    entries = [ln.split(None, 1)[::-1] for ln in lines if ln and not ln.startswith("#")]
    if not entries:
        raise ValueError(f"the API key file {path} is empty")
    keys = {e[0].strip(): e[1].strip() if len(e) > 1 else "" for e in entries}
    names = [n for n in keys.values() if n]
    if len(keys) < len(entries) or len(set(names)) < len(names):
        raise ValueError(f"the API key file {path} repeats a key or a name")
    return keys


def client_key(key_file: str | None) -> str | None:
    """The key a client sends: the first of --api-key-file, else KWKER_API_KEY, else none."""
    if key_file:
        return next(iter(read_key_file(key_file)))
    return os.environ.get(ENV) or None
