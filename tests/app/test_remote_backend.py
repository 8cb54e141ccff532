"""The window on a model on a server, against real servers on 127.0.0.1: `kwker serve` and
llama-cpp-python's own OpenAI-compatible server on the same SmolLM2 GGUF (both with an API key), a
tiny server that drops its stream midway, one that answers with a canned error, and a port nothing
listens on. A server is added in the model picker, its answers stream into the window, Stop closes
the stream (and kwker serve stops generating), failures are said in words, and the key is kept in
the keyring or a 0600 file, never in the settings."""

from __future__ import annotations

import json
import stat
import time

import keyring
import keyring.backend
import keyring.errors
import pytest
from app_helpers import LOAD_TIMEOUT_MS, open_window
from keyring.backends import fail
from remote_servers import (
    CUT_PIECES,
    LONG_PROMPT,
    canned_server,
    cutting_server,
    generated_tokens,
    refused_port,
)

from kwker.app import keys
from kwker.app.views.stats_panel import CLIENT_FIGURES, SERVER_FIGURES

ANSWER_TIMEOUT_MS = 120_000


class MemoryKeyring(keyring.backend.KeyringBackend):
    """A keyring that works (the test machines have none: no Secret Service)."""

    priority = 1

    def __init__(self):
        super().__init__()
        self.passwords: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.passwords.get((service, username))

    def set_password(self, service, username, password):
        self.passwords[(service, username)] = password

    def delete_password(self, service, username):
        if self.passwords.pop((service, username), None) is None:
            raise keyring.errors.PasswordDeleteError(username)


class LockedKeyring(MemoryKeyring):
    """A keyring that is there but refuses (a locked collection, a dead D-Bus)."""

    def get_password(self, service, username):
        raise keyring.errors.KeyringLocked("locked")

    def set_password(self, service, username, password):
        raise keyring.errors.PasswordSetError("locked")


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    """The app's config folder (platformdirs: XDG_CONFIG_HOME) in the test's tmp_path."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "kwker"


@pytest.fixture
def memory_keyring():
    before = keyring.get_keyring()
    ring = MemoryKeyring()
    keyring.set_keyring(ring)
    yield ring
    keyring.set_keyring(before)


@pytest.fixture
def no_keyring():
    before = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(before)


@pytest.fixture
def data(data_dir, config_dir, no_keyring):
    """A fresh data folder and config folder, no system keyring (the file keeps the keys)."""
    return data_dir


def remote_window(qtbot, url: str, model: str, key: str | None = None, settings=None):
    """The window chatting with `model` on the server at url (the key kept first, as the picker
    would), once connected or once it said why not."""
    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow
    from kwker.remote import normalize_url

    if key:
        keys.save_key(normalize_url(url), key)
    store = Store()
    store.save_settings(
        {"server_url": url, "server_model": model, "temperature": 0.0, "max_new_tokens": 16,
         **(settings or {})}
    )  # fmt: skip
    win = MainWindow(store)
    qtbot.addWidget(win)
    qtbot.waitUntil(lambda: win.model_info is not None or win.progress.isHidden(), timeout=30_000)
    return win


def ask(qtbot, win, text: str, timeout=ANSWER_TIMEOUT_MS):
    assert win.send(text)
    qtbot.waitUntil(lambda: not win.generating, timeout=timeout)
    return win.messages[-1]


def model_of(server) -> str:
    status, body = server.get("/v1/models", server.key)
    assert status == 200, body
    return json.loads(body)["data"][0]["id"]


# ---------------------------------------------------------------------------------------- keys
def test_a_key_goes_to_the_keyring_when_there_is_one(config_dir, memory_keyring):
    where = keys.save_key("http://h:8000/v1", "sk-one")
    assert where == keys.KEYRING
    assert memory_keyring.passwords == {(keys.SERVICE, "http://h:8000/v1"): "sk-one"}
    assert keys.load_key("http://h:8000/v1") == "sk-one" and not keys.key_file().exists()
    keys.delete_key("http://h:8000/v1")
    assert memory_keyring.passwords == {} and keys.load_key("http://h:8000/v1") is None


@pytest.mark.parametrize("ring", [fail.Keyring, LockedKeyring], ids=["no keyring", "locked"])
def test_without_a_usable_keyring_a_key_goes_to_a_file_only_the_user_can_read(config_dir, ring):
    before = keyring.get_keyring()
    keyring.set_keyring(ring())
    try:
        assert keys.save_key("http://a:1/v1", "sk-a") == keys.FILE
        assert keys.save_key("http://b:2/v1", "sk-b") == keys.FILE
        path = keys.key_file()
        assert path.parent == config_dir
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert json.loads(path.read_text()) == {"http://a:1/v1": "sk-a", "http://b:2/v1": "sk-b"}
        assert keys.load_key("http://a:1/v1") == "sk-a"
        keys.delete_key("http://a:1/v1")
        assert json.loads(path.read_text()) == {"http://b:2/v1": "sk-b"}
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        keys.delete_key("http://b:2/v1")
        assert not path.exists()
    finally:
        keyring.set_keyring(before)


# ------------------------------------------------------------------ failures, without a model
def test_a_stream_cut_midway_keeps_the_partial_answer_marked_as_cut(qtbot, data):
    from kwker.app.store import Store

    with cutting_server() as url:
        win = remote_window(qtbot, url, "cut-model")
        assert win.model_info["server"] == url
        msg = ask(qtbot, win, "Tell me something.")
    assert msg.role == "assistant" and msg.content == "".join(CUT_PIECES)
    assert msg.complete and msg.stats["finish_reason"] == "cut"
    assert "cut midway" in msg.stats["error"]
    assert "The answer was cut midway: the connection was lost." in win.status.text()
    assert "The text that arrived is kept." in win.status.text()
    assert (
        "(cut midway)" in win.view.toPlainText() and "The answer so far" in win.view.toPlainText()
    )
    win.close()
    again = Store().messages(win.cid)[-1]  # persisted
    assert again.content == "".join(CUT_PIECES) and again.stats["finish_reason"] == "cut"


def test_an_unreachable_server_is_said_in_the_window(qtbot, data):
    url = refused_port()
    win = remote_window(qtbot, url, "any")
    assert win.model_info is None and not win.send_button.isEnabled()
    assert win.status.text() == (
        f"Could not use any on {url}: Cannot reach the server at {url} (connection refused). "
        "Is it running, and is the address right?"
    )


def test_a_server_that_goes_away_after_connecting_is_said_when_asked(qtbot, data):
    with cutting_server() as url:
        win = remote_window(qtbot, url, "cut-model")
    assert win.model_info is not None  # connected; now nothing listens there
    assert win.send("Hello?")
    qtbot.waitUntil(lambda: not win.generating, timeout=30_000)
    assert win.status.text().startswith(f"Error: Cannot reach the server at {url}")
    assert [m.role for m in win.messages] == ["user"]  # no empty answer left behind


@pytest.mark.parametrize(
    "status, error, said",
    [
        (401, {"message": "bad key", "type": "authentication_error"}, "refused the API key (401: bad key)."),
        (404, {"message": "no such model", "type": "invalid_request_error", "code": "model_not_found"},
         "has no model “m” (404: no such model)."),
        (429, {"message": "queue full", "type": "rate_limit_error"},
         "is busy (429: queue full). Try again in a moment."),
    ],
)  # fmt: skip
def test_a_refusal_is_said_with_the_servers_own_message(qtbot, data, status, error, said):
    """A server that lists model "m" but answers every chat request with `status` and an error in
    the OpenAI shape: its message is read and said."""
    with canned_server(status, {"error": {"param": None, "code": None, **error}}) as url:
        win = remote_window(qtbot, url, "m", key="sk-test")
        assert win.model_info is not None
        ask(qtbot, win, "Hello?")
    assert win.status.text() == f"Error: The server at {url} {said}"


def test_the_local_only_settings_are_hidden_for_a_servers_model(qtbot, data):
    with cutting_server() as url:
        win = remote_window(qtbot, url, "cut-model")
        panel = win.settings_panel
        win.tabs.setCurrentWidget(win.settings_tab)
        win.show()
        qtbot.waitExposed(win)
        assert panel.server.isVisible() and panel.server.text() == f"cut-model on {url}"
        for hidden in (panel.context_length, panel.draft_model, panel.threads, panel.top_k):
            assert not hidden.isVisible()
        assert panel.temperature.isVisible() and panel.max_new_tokens.isVisible()
        assert win.stats.model.text() == f"cut-model · on {url}"


# ------------------------------------------------------------------------- real servers
@pytest.mark.slow
def test_a_server_added_in_the_picker_answers_in_the_window(qtbot, data, server):
    """From a window on the local model: Models… → Servers, the address and key, Connect, its
    models listed, Chat with this model; the answer streams, the choice persists, the key is in
    the 0600 file and nowhere in the settings' database."""
    from kwker.app.store import Store, data_dir

    win = open_window(qtbot)
    picker = win.model_choice.open_picker()
    qtbot.addWidget(picker)
    panel = picker.servers
    picker.tabs.setCurrentWidget(panel)
    panel.address.setCurrentText(server.url.removesuffix("/v1").removeprefix("http://"))
    panel.key.setText(server.key)
    panel.connect_button.click()
    qtbot.waitUntil(lambda: panel.models.count() > 0, timeout=30_000)
    model = model_of(server)
    assert panel.selected_model() == model
    assert (
        "its key is kept in" in panel.status.text() and "only you can read" in panel.status.text()
    )
    panel.use_button.click()
    qtbot.waitUntil(
        lambda: win.model_info is not None and win.model_info["server"] == server.url,
        timeout=LOAD_TIMEOUT_MS,
    )
    picker.close()
    assert win.status.text() == f"Ready: {model} on {server.url}"

    seen = []
    win.worker.chunk.connect(lambda text, *_: seen.append(text))
    msg = ask(qtbot, win, "What is the capital of France?")
    assert msg.complete and msg.stats["finish_reason"] in ("stop", "length")
    assert len(seen) > 3 and "".join(seen) == msg.content and len(msg.content) > 10
    assert msg.content in win.view.toPlainText().replace("\u2029", "\n")
    assert win.stats.rate.text().endswith("tokens/s")
    if server.name == "kwker":
        assert msg.stats["measured"] == "server"  # a Kwker server reports its own figures
        assert win.stats.measured.text() == SERVER_FIGURES
        assert win.stats.speedup.text().endswith("×")
    else:
        assert msg.stats["measured"] == "client"
        assert win.stats.measured.text().startswith(CLIENT_FIGURES)
        assert win.stats.speedup.text() == "–"  # no speedup is made up for a server
        assert win.stats.prefill.text().startswith("first token after ")

    saved = Store().settings()
    assert saved["server_url"] == server.url and saved["server_model"] == model
    assert saved["servers"][0] == server.url
    path = keys.key_file()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {server.url: server.key}
    database = b"".join(p.read_bytes() for p in data_dir().iterdir() if p.is_file())
    assert server.key.encode() not in database

    win.close()  # the next start chats with the same server's model
    again = open_window(qtbot, keep_saved=True)
    assert again.model_info["server"] == server.url and again.model_info["model"] == model


@pytest.mark.slow
def test_stop_closes_the_stream_and_the_server_stops_generating(qtbot, data, server):
    win = remote_window(
        qtbot, server.url, model_of(server), key=server.key, settings={"max_new_tokens": 1000}
    )
    assert win.model_info is not None, win.status.text()
    before = server.metrics()
    win.send(LONG_PROMPT)
    qtbot.waitUntil(
        lambda: len(win.stream_text) > 40 or not win.generating, timeout=ANSWER_TIMEOUT_MS
    )
    assert win.generating, win.status.text()
    win.send_button.click()  # Stop
    qtbot.waitUntil(lambda: not win.generating, timeout=10_000)
    msg = win.messages[-1]
    assert msg.stats["finish_reason"] == "stopped" and "(stopped)" in win.view.toPlainText()
    text = msg.content
    # the server is idle: its active slots empty and its token count still (kwker serve's
    # /metrics), and it spends no more CPU (any server)
    if before is not None:
        qtbot.waitUntil(lambda: server.metrics()["kwker_active_slots"] == 0, timeout=5_000)
        generated = generated_tokens(server.metrics()) - generated_tokens(before)
        assert generated < 200, generated  # far from the 1000 asked
    time.sleep(0.5)
    cpu = server.cpu_seconds()
    time.sleep(1.5)
    assert server.cpu_seconds() - cpu < 0.3  # a generation would keep a core busy
    qtbot.wait(300)
    assert win.messages[-1].content == text  # nothing arrived after Stop


@pytest.mark.slow
@pytest.mark.parametrize("key", [None, "a-wrong-key"], ids=["no key", "wrong key"])
def test_a_missing_or_wrong_key_is_said_and_not_kept(qtbot, data, server, key):
    verdict = "refused the API key" if key else "needs an API key"
    said = f"The server at {server.url} {verdict} (401: "
    # in the picker: nothing is listed, the key is not kept
    win = remote_window(qtbot, refused_port(), "any")  # a window on no server yet
    picker = win.model_choice.open_picker()
    qtbot.addWidget(picker)
    panel = picker.servers
    panel.address.setCurrentText(server.url)
    panel.key.setText(key or "")
    panel.connect_button.click()
    qtbot.waitUntil(lambda: "(401" in panel.status.text(), timeout=30_000)
    assert panel.status.text().startswith(said)
    assert panel.models.count() == 0 and not panel.use_button.isEnabled()
    assert keys.load_key(server.url) is None  # a refused key is not kept
    picker.close()
    win.close()
    # in the window, on a server whose key changed since it was chosen
    win = remote_window(qtbot, server.url, model_of(server), key=key)
    assert win.model_info is None
    assert win.status.text().startswith(f"Could not use {model_of(server)} on {server.url}: {said}")
    assert win.status.text().endswith("Models… → Servers takes a new key.")
