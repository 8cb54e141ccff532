"""Tools from MCP servers in the window, with the app's default model (Qwen2.5-Coder-1.5B-Instruct
at int4) and a stdio MCP server written here with the mcp package: the model calls a tool, the
user is asked first, and the answer goes on from the tool's result; a denied call is not run; a
call that times out and a server that crashes are said, and the chat goes on; the call is saved
with the answer, exported, and shown again after a restart.

The server's tools leave proof that they ran: secret_word writes the name it was asked about to a
file and returns a secret the answer must repeat."""

import json
import textwrap

import pytest
from app_helpers import open_window
from remote_servers import kwker_serve

from kwker.app.export import export
from kwker.app.store import Store
from kwker.models import CHAT_MODEL

SECRET = "PELICAN-7731"
SERVER = textwrap.dedent(
    """
    import os, sys, time
    from mcp.server.mcpserver import MCPServer

    mcp = MCPServer("test tools")
    ASKED = os.environ["ASKED_FILE"]  # given by mcp.json's env: nothing else is inherited

    @mcp.tool()
    def secret_word(name: str) -> str:
        \"\"\"Returns the secret word of a person.\"\"\"
        with open(ASKED, "a") as f:
            f.write(name + "\\n")
        return f"The secret word of {name} is PELICAN-7731."

    @mcp.tool()
    def weather(city: str) -> str:
        \"\"\"Returns today's weather in a city.\"\"\"
        time.sleep(60)
        return "sunny"

    @mcp.tool()
    def stock_price(symbol: str) -> str:
        \"\"\"Returns the stock price of a company.\"\"\"
        print("stock feed lost, exiting", file=sys.stderr, flush=True)
        os._exit(3)

    mcp.run()
    """
)


@pytest.fixture
def tools_server(data_dir, tmp_path):
    """mcp.json (in the test's config folder) with the server above on; the file its
    secret_word writes to."""
    import sys

    script = tmp_path / "server.py"
    script.write_text(SERVER)
    asked = tmp_path / "asked.txt"
    config = tmp_path / "config" / "kwker" / "mcp.json"
    config.parent.mkdir(parents=True)
    entry = {"command": sys.executable, "args": [str(script)], "env": {"ASKED_FILE": str(asked)}}
    config.write_text(json.dumps({"mcpServers": {"test": entry}}))
    return asked


def tool_window(qtbot, **kw):
    win = open_window(qtbot, {"model": CHAT_MODEL, "precision": "int4", "max_new_tokens": 60,
                              "context_length": 2048}, **kw)  # fmt: skip
    qtbot.waitUntil(lambda: len(win.tool_use.host.tools()) == 3, timeout=30_000)
    return win


def approve(qtbot, win, button: str):
    qtbot.waitUntil(lambda: win.tool_use.dialog is not None, timeout=120_000)
    dialog = win.tool_use.dialog
    assert dialog.isVisible() and dialog.windowTitle() == "Run a tool?"
    getattr(dialog, button).click()
    return dialog


def test_a_tool_call_approved_answered_saved_and_reopened(qtbot, tools_server):
    win = tool_window(qtbot)
    tree = win.tool_use.panel.tree  # the Tools tab lists the server and its tools
    item = tree.topLevelItem(0)
    assert item.text(0) == "test · running, 3 tools"
    assert [item.child(i).text(0) for i in range(3)] == ["secret_word", "weather", "stock_price"]

    assert win.send("What is the secret word of Alice?")
    dialog = approve(qtbot, win, "once")
    assert json.loads(dialog.arguments.toPlainText()) == {"name": "Alice"}
    qtbot.waitUntil(lambda: not win.generating, timeout=120_000)
    assert tools_server.read_text() == "Alice\n"  # the tool really ran, once
    answer = win.messages[-1]
    assert SECRET in answer.content  # the answer went on from the result
    (call,) = answer.tool_calls
    assert (call["server"], call["tool"], call["status"]) == ("test", "secret_word", "done")
    assert call["result"] == f"The secret word of Alice is {SECRET}."
    shown = win.view.toPlainText()
    assert "▸ Tool call test · secret_word done in" in shown
    assert shown.index("Tool call") < shown.rindex(SECRET)

    # its block opens on the arguments and the result
    win.chat.toggle_tool_call(len(win.messages) - 1, 0)
    shown = win.view.toPlainText()
    assert '"name": "Alice"' in shown and f"The secret word of Alice is {SECRET}." in shown

    cid = win.cid
    md = export(win.store, cid, "md", win.model_info, {})
    assert "<details><summary>Tool call: test · secret_word (done)</summary>" in md
    assert json.loads(export(win.store, cid, "json", None, {}))["messages"][-1]["tool_calls"][0][
        "result"
    ].endswith(SECRET + ".")
    win.close()

    # a restart: the call comes back from the store, shown as before
    store = Store()
    (reopened,) = [m for m in store.messages(cid) if m.role == "assistant"]
    assert reopened.tool_calls == answer.tool_calls and reopened.content == answer.content
    store.close()
    win = tool_window(qtbot, keep_saved=True)
    win.open_conversation(cid)
    assert "▸ Tool call test · secret_word done in" in win.view.toPlainText()


def test_denied_timed_out_and_crashed_calls(qtbot, tools_server):
    win = tool_window(qtbot)
    win.worker.call_timeout = 2.0

    # denied: not run, said, and the answer ends
    assert win.send("What is the secret word of Bob?")
    approve(qtbot, win, "deny")
    qtbot.waitUntil(lambda: not win.generating, timeout=120_000)
    assert not tools_server.exists()  # the tool never ran
    (call,) = win.messages[-1].tool_calls
    assert call["status"] == "denied" and call["arguments"] == {"name": "Bob"}
    assert "Tool call test · secret_word denied" in win.view.toPlainText()

    # a call that does not answer in time: given up, said, and the chat goes on
    win.new_chat()
    assert win.send("What is the weather in Paris today?")
    approve(qtbot, win, "once")
    qtbot.waitUntil(lambda: not win.generating, timeout=120_000)
    (call,) = win.messages[-1].tool_calls
    assert call["status"] == "timeout" and 2.0 <= call["seconds"] < 10
    said = "did not answer within 2 s, so the call was given up"
    assert said in call["result"] and said in win.view.toPlainText()

    # a server that crashes mid-call: said in words, with what it printed; the chat goes on
    win.new_chat()
    assert win.send("What is the stock price of ACME?")
    approve(qtbot, win, "always")
    qtbot.waitUntil(lambda: not win.generating, timeout=120_000)
    (call,) = win.messages[-1].tool_calls
    assert call["status"] == "error"
    assert (
        "stopped while running “stock_price” (it said: stock feed lost, exiting)"
        in (call["result"])
    )
    assert "Tool call test · stock_price failed: The tool server “test” stopped" in (
        win.view.toPlainText()
    )
    assert win.store.settings()["mcp_always_allow"] == ["test/stock_price"]
    state = win.tool_use.host.states()[0]
    assert state.status == "failed"
    assert win.tool_use.panel.tree.topLevelItem(0).text(0) == "test · failed"
    assert not win.generating and win.send("Thanks!")  # the chat goes on
    qtbot.waitUntil(lambda: not win.generating, timeout=120_000)
    assert win.messages[-1].content and not win.messages[-1].tool_calls


def test_a_servers_model_calls_a_tool_after_approval(qtbot, tools_server, tmp_path):
    """The same loop with the model on an OpenAI-compatible server (kwker serve, Qwen2.5-Coder-
    1.5B-Instruct at int4): the app offers the MCP tools through the API, the server's
    tool_calls are asked about and run here, and its answer goes on from the result."""
    from kwker.app import keys
    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow
    from kwker.remote import normalize_url

    with kwker_serve(tmp_path, model=[CHAT_MODEL, "--precision", "int4"]) as server:
        keys.save_key(normalize_url(server.url), server.key)
        store = Store()
        store.save_settings({"server_url": server.url, "server_model": CHAT_MODEL,
                             "temperature": 0.0, "max_new_tokens": 60})  # fmt: skip
        win = MainWindow(store)
        qtbot.addWidget(win)
        qtbot.waitUntil(lambda: win.model_info is not None, timeout=60_000)
        assert win.model_info["server"] == server.url
        qtbot.waitUntil(lambda: len(win.tool_use.host.tools()) == 3, timeout=30_000)
        assert win.send("What is the secret word of Carol?")
        dialog = approve(qtbot, win, "once")
        assert json.loads(dialog.arguments.toPlainText()) == {"name": "Carol"}
        qtbot.waitUntil(lambda: not win.generating, timeout=180_000)
        assert tools_server.read_text() == "Carol\n"  # run here, once
        answer = win.messages[-1]
        (call,) = answer.tool_calls
        assert (call["tool"], call["status"]) == ("secret_word", "done")
        assert SECRET in answer.content  # the server's model answered from the result
        win.close()
