"""The MCP side without a model: mcp.json as Claude Desktop and LM Studio write it (checked, and
written back with its other keys kept), the host's servers (started only when switched on, a
failed start said in words, a stdio server's environment only the config's and the minimal
one), and Kwker's built-in files server (lists and reads its folder, refuses any path out)."""

import json
import os
import sys

import pytest

from kwker.app import mcp_config
from kwker.app.mcp_config import ConfigError, ServerSpec
from kwker.app.mcp_host import FAILED, OFF, RUNNING, McpHost


def test_mcp_json_is_read_checked_and_written_back(tmp_path):
    path = tmp_path / "mcp.json"
    text = {"mcpServers": {
        "fs": {"command": "npx", "args": ["-y", "server-fs"], "env": {"A": "1"}, "note": "mine"},
        "web": {"url": "http://127.0.0.1:1/mcp", "headers": {"X": "y"}, "disabled": True}},
        "globalShortcut": "Ctrl+Space"}  # fmt: skip
    mcp_config.save_text(json.dumps(text), path)
    fs, web = mcp_config.load(path)
    assert (fs.command, fs.args, fs.env, fs.enabled) == (
        "npx",
        ["-y", "server-fs"],
        {"A": "1"},
        True,
    )
    assert (web.url, web.headers, web.enabled) == ("http://127.0.0.1:1/mcp", {"X": "y"}, False)
    mcp_config.set_enabled("web", True, path)
    mcp_config.set_enabled("fs", False, path)
    saved = json.loads(path.read_text())
    assert saved["globalShortcut"] == "Ctrl+Space" and saved["mcpServers"]["fs"]["note"] == "mine"
    assert saved["mcpServers"]["fs"]["disabled"] and "disabled" not in saved["mcpServers"]["web"]
    for bad, said in (
        ("{", "not valid JSON"),
        ('{"mcpServers": {"x": {"command": "a", "url": "b"}}}', "not both"),
        ('{"mcpServers": {"x": {"command": "a", "args": "b"}}}', "“args” must be a list"),
    ):
        with pytest.raises(ConfigError, match=said):
            mcp_config.save_text(bad, path)
    assert json.loads(path.read_text()) == saved  # a refused text writes nothing


def wait(host, qtbot):
    qtbot.waitUntil(lambda: all(s.status != "starting" for s in host.states()), timeout=30_000)


def test_the_host_runs_only_what_is_on_and_says_what_fails(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_TEST_SECRET", "must-not-leak")
    env_server = tmp_path / "env_server.py"
    env_server.write_text(
        "import os\nfrom mcp.server.mcpserver import MCPServer\nmcp = MCPServer('env')\n"
        "@mcp.tool()\ndef env() -> str:\n    return ' '.join(sorted(os.environ))\nmcp.run()\n"
    )
    host = McpHost(tmp_path / "logs")
    try:
        host.apply([
            ServerSpec("env", sys.executable, [str(env_server)], {"GIVEN": "1"}),
            ServerSpec("off", sys.executable, [str(env_server)], enabled=False),
            ServerSpec("missing", "no-such-program-kwker"),
            ServerSpec("exits", sys.executable, ["-c", "import sys; sys.exit('bad config')"]),
        ])  # fmt: skip
        wait(host, qtbot)
        states = {s.spec.name: s for s in host.states()}
        assert states["env"].status == RUNNING and states["off"].status == OFF
        assert states["missing"].status == states["exits"].status == FAILED
        assert states["missing"].error == (
            "could not start: the program “no-such-program-kwker” was not found"
        )
        assert states["exits"].error == "exited before it answered (it said: bad config)"
        names = set(host.call("env", "env", {}).text.split())
        assert "GIVEN" in names and "PATH" in names and "KWKER_TEST_SECRET" not in names
        assert names <= {"GIVEN", "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LC_CTYPE"}
        assert [t.server for t in host.tools()] == ["env"]  # only a running server's tools
    finally:
        host.close()


def test_the_built_in_files_server_reads_its_folder_only(qtbot, tmp_path):
    shared = tmp_path / "shared"
    (shared / "sub").mkdir(parents=True)
    (shared / "notes.txt").write_text("The meeting is on Tuesday.")
    (shared / "sub" / "a.md").write_text("# A")
    (tmp_path / "secret.txt").write_text("outside")
    os.symlink(tmp_path / "secret.txt", shared / "link.txt")
    entry = mcp_config.files_server_entry(str(shared))
    host = McpHost(tmp_path / "logs")
    try:
        host.apply([ServerSpec("files", entry["command"], entry["args"])])
        wait(host, qtbot)
        assert [t.name for t in host.tools()] == ["list_files", "read_file"]
        listed = host.call("files", "list_files", {"path": "."})
        assert listed.status == "done"
        assert listed.text.splitlines()[1:] == ["notes.txt (26 bytes)", "sub/"]
        assert host.call("files", "read_file", {"path": "notes.txt"}).text == (
            "The meeting is on Tuesday."
        )
        assert host.call("files", "read_file", {"path": "sub/a.md"}).text == "# A"
        for path in ("../secret.txt", str(tmp_path / "secret.txt"), "link.txt"):
            refused = host.call("files", "read_file", {"path": path})
            assert refused.status == "error" and "outside the shared folder" in refused.text
            assert "outside" not in refused.text.replace("outside the shared", "")
    finally:
        host.close()
