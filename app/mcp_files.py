"""Kwker's built-in example MCP server: the files of one folder the user picked, read-only.

    python -m kwker.app.mcp_files FOLDER      # an MCP server on stdin/stdout

Two tools: list_files (a folder's entries, under FOLDER) and read_file (a text file's text, the
first MAX_BYTES of it). Any path that resolves outside FOLDER (.., an absolute path, a symbolic
link that leads out) is refused, and nothing is ever written. The app adds it to mcp.json when
the user picks a folder in the Tools tab (kwker.app.mcp_config.files_server_entry): it needs
nothing but the mcp package, so tools work offline on a fresh install."""

from __future__ import annotations

import sys
from pathlib import Path

MAX_BYTES = 64_000  # a file's text is cut here: the model's context holds a few thousand tokens
MAX_ENTRIES = 500


class Refused(ValueError):
    """A path the server does not give: the message goes back to the model as the tool's error."""


def inside(root: Path, path: str) -> Path:
    """`path` (relative to root) resolved, if it is root or under it; else Refused."""
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        raise Refused(f"{path!r} is outside the shared folder; only files under it can be read.")
    return target


def list_files(root: Path, path: str = ".") -> str:
    folder = inside(root, path)
    if not folder.is_dir():
        raise Refused(f"{path!r} is not a folder.")
    rows = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name.lower())[:MAX_ENTRIES]:
        rel = entry.relative_to(root).as_posix()
        rows.append(f"{rel}/" if entry.is_dir() else f"{rel} ({entry.stat().st_size:,} bytes)")
    return "\n".join(rows) or "(the folder is empty)"


def read_file(root: Path, path: str) -> str:
    target = inside(root, path)
    if not target.is_file():
        raise Refused(f"{path!r} is not a file.")
    with target.open("rb") as f:
        data = f.read(MAX_BYTES + 1)
    if b"\0" in data[:4096]:
        raise Refused(f"{path!r} is not a text file.")
    text = data[:MAX_BYTES].decode("utf-8", errors="replace")
    return text + (f"\n[… cut at {MAX_BYTES:,} bytes]" if len(data) > MAX_BYTES else "")


def server(root: Path):
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    root = root.resolve()
    mcp = MCPServer("Kwker files", instructions=f"Reads the files of the folder {root}.")

    def said(fn, *args) -> str:
        """A refusal or a failure to read goes to the model in words (the SDK's ToolError:
        any other exception reaches it only as "Error executing tool")."""
        try:
            return fn(root, *args)
        except (Refused, OSError) as e:
            raise ToolError(str(e)) from e

    @mcp.tool(name="list_files")
    def list_tool(path: str = ".") -> str:
        """Lists the files and folders in a folder of the shared folder (path relative to it;
        "." is the shared folder itself)."""
        return said(list_files, path)

    @mcp.tool(name="read_file")
    def read_tool(path: str) -> str:
        """Reads a text file of the shared folder (path relative to it)."""
        return said(read_file, path)

    return mcp


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python -m kwker.app.mcp_files FOLDER (an existing folder)", file=sys.stderr)
        return 2
    server(Path(argv[0])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
