"""The MCP servers the user configured: `mcp.json` in the app's config folder (XDG_CONFIG_HOME
moves it on Linux, as it moves every app's config), in the format Claude Desktop and LM Studio
read, so a file written for them works here as it is:

    {"mcpServers": {
        "files": {"command": "python", "args": ["-m", "server"], "env": {"ROOT": "/tmp"}},
        "web": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer …"}},
        "old": {"command": "npx", "args": ["…"], "disabled": true}}}

`command`/`args`/`env` start a server on this machine and talk to it over its stdin and stdout;
`url` reaches one over streamable HTTP (with optional `headers`). `disabled` (Cline's key, which
the others ignore) switches a server off without losing its entry. Any other key is kept as it
was when the app writes the file back.

Nothing here starts anything: kwker.app.mcp_host starts the enabled servers of this file, and
only those."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

CONFIG_FILE = "mcp.json"
FILES_SERVER = "files"  # the name the built-in example server gets when the user adds it


class ConfigError(ValueError):
    """The file cannot be used; the message says where and why, in words."""


@dataclass
class ServerSpec:
    name: str
    command: str = ""  # stdio: the program, its arguments and its environment
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""  # streamable HTTP: the endpoint, and the headers to send
    headers: dict[str, str] = field(default_factory=dict)
    enabled: bool = True

    @property
    def where(self) -> str:
        """What the settings show of how it is reached: its command line or its address."""
        return self.url or " ".join([self.command, *self.args])


def config_path() -> Path:
    return Path(platformdirs.user_config_dir("kwker")) / CONFIG_FILE


def read_text(path: Path | None = None) -> str:
    """The file's text, or an empty configuration when there is none yet."""
    path = path or config_path()
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return '{\n  "mcpServers": {}\n}\n'


def parse(text: str) -> list[ServerSpec]:
    """The servers of a configuration's text, in its order. Raises ConfigError."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"mcp.json is not valid JSON: {e.msg} (line {e.lineno}).") from e
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers", {}), dict):
        raise ConfigError('mcp.json must be an object with an "mcpServers" object in it.')
    specs = []
    for name, entry in data.get("mcpServers", {}).items():
        specs.append(_spec(name, entry))
    return specs


def _spec(name: str, entry) -> ServerSpec:
    def strings(key, kind):
        value = entry.get(key, kind())
        ok = all(isinstance(v, str) for v in (value.values() if kind is dict else value))
        if not isinstance(value, kind) or not ok:
            what = "a list of strings" if kind is list else "an object of strings"
            raise ConfigError(f"Server “{name}”: “{key}” must be {what}.")
        return value

    if not isinstance(entry, dict):
        raise ConfigError(f"Server “{name}” must be an object.")
    command, url = entry.get("command", ""), entry.get("url", "")
    if not isinstance(command, str) or not isinstance(url, str) or bool(command) == bool(url):
        raise ConfigError(
            f"Server “{name}” needs either a “command” (a program to start) or a “url” "
            "(a streamable HTTP endpoint), not both."
        )
    return ServerSpec(
        name, command, strings("args", list), strings("env", dict), url,
        strings("headers", dict), not entry.get("disabled", False),
    )  # fmt: skip


def load(path: Path | None = None) -> list[ServerSpec]:
    return parse(read_text(path))


def save_text(text: str, path: Path | None = None) -> list[ServerSpec]:
    """Writes a configuration the user edited, once it parses (else ConfigError, nothing
    written). Returns its servers."""
    specs = parse(text)
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    os.replace(tmp, path)  # never a half-written file, whatever happens midway
    return specs


def _update(change, path: Path | None = None) -> list[ServerSpec]:
    data = json.loads(read_text(path))
    data.setdefault("mcpServers", {})
    change(data["mcpServers"])
    return save_text(json.dumps(data, indent=2, ensure_ascii=False), path)


def set_enabled(name: str, enabled: bool, path: Path | None = None) -> list[ServerSpec]:
    """Switches a server on or off, the rest of the file as it was."""

    def change(servers):
        if enabled:
            servers[name].pop("disabled", None)
        else:
            servers[name]["disabled"] = True

    return _update(change, path)


def files_server_entry(folder: str) -> dict:
    """The built-in example (kwker.app.mcp_files) on a folder: this Python runs it, so it works
    offline on a fresh install."""
    return {"command": sys.executable, "args": ["-m", "kwker.app.mcp_files", folder]}


def add_server(name: str, entry: dict, path: Path | None = None) -> list[ServerSpec]:
    """Adds (or replaces) a server's entry."""
    return _update(lambda servers: servers.__setitem__(name, entry), path)
