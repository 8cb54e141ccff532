"""The rolling window's arithmetic (kwker.app.context_window), the speculation tint over Markdown
(kwker.app.render) and the store's schema migration, without a model: a render that counts words
stands in for the chat template."""

import sqlite3

import pytest

from kwker.app.context_window import ROLLING, STOP, ContextFull, answer_reserve, fit_prompt
from kwker.app.render import add_run, markdown_html
from kwker.app.store import SCHEMA_VERSION, Store

COLORS = {"lookup": "#ff0000", "draft": "#00ff00"}


def render(messages):
    """One token per word, plus two per message (its role markers)."""
    return [w for m in messages for w in [m["role"], *m["content"].split(), "<end>"]]


def chat(turns: int, words: int = 20):
    out = []
    for i in range(turns):
        out.append({"role": "user", "content": f"question{i} " + "w " * words})
        out.append({"role": "assistant", "content": f"answer{i} " + "w " * words})
    return out + [{"role": "user", "content": "newest " + "w " * words}]


def test_a_conversation_that_fits_is_sent_whole():
    messages = chat(2)
    p = fit_prompt(render, "sys", messages, 0, 512, 64)
    assert p.start == 0 and p.ids == render([{"role": "system", "content": "sys"}] + messages)
    assert p.room == 512 - len(p.ids)


def test_the_rolling_window_drops_whole_turns_and_keeps_the_system_prompt():
    messages = chat(10)  # 21 messages of 23 tokens: 483 tokens + the system prompt
    p = fit_prompt(render, "be brief", messages, 0, 256, 64)
    assert p.ids[:4] == ["system", "be", "brief", "<end>"]  # the system prompt stays
    assert messages[p.start]["role"] == "user" and p.start > 0  # cut at a user turn
    assert p.ids[-23:] == render(messages[-1:])  # the newest message is in
    # the cut leaves the answer's room and a quarter of the context: the next turns keep this start
    assert len(p.ids) <= 256 - answer_reserve(256, 64) - 256 // 4
    following = messages + [
        {"role": "assistant", "content": "short"},
        {"role": "user", "content": "next"},
    ]
    again = fit_prompt(render, "be brief", following, p.start, 256, 64)
    assert again.start == p.start and again.ids[: len(p.ids)] == p.ids  # same prefix: cache reuse


def test_the_window_never_moves_back():
    messages = chat(10)
    p = fit_prompt(render, "", messages, 7, 4096, 64)  # plenty of room, but the window is at 7
    assert p.start == 7


def test_the_stop_policy_refuses_with_the_reason():
    with pytest.raises(ContextFull, match="no longer fits the context of 256 tokens"):
        fit_prompt(render, "", chat(10), 0, 256, 64, STOP)


def test_a_newest_message_longer_than_the_context_is_refused():
    messages = [{"role": "user", "content": "w " * 600}]
    with pytest.raises(ContextFull, match="the newest message is 602 tokens"):
        fit_prompt(render, "", messages, 0, 512, 64, ROLLING)


def test_a_newest_message_that_leaves_little_room_gets_what_is_left():
    messages = chat(3) + [
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "w " * 450},
    ]
    p = fit_prompt(render, "", messages, 0, 512, 128)
    assert p.start == len(messages) - 1 and p.room == 512 - 452


def test_the_answer_reserve_is_at_most_half_the_context():
    assert answer_reserve(512, 4096) == 256 and answer_reserve(4096, 512) == 512


def test_tint_follows_the_text_through_markdown():
    text = "Use **bold** here:\n\n```python\nx = 1 & 2\n```\n\n- one\n- two\n"
    runs: list = []
    add_run(runs, "Use **", "")
    add_run(runs, "bold** here:\n\n```python\nx = 1", "lookup")
    add_run(runs, " & 2\n```\n\n- one\n- t", "")
    add_run(runs, "wo\n", "draft")
    assert runs[0] == [6, ""] and sum(n for n, _ in runs) == len(text)
    rendered = markdown_html(text, [], runs, COLORS)
    assert '<strong><span style="background-color:#ff0000">bold</span></strong>' in rendered
    assert '<span style="background-color:#ff0000">x = 1</span> &amp; 2' in rendered
    assert '<li>t<span style="background-color:#00ff00">wo</span></li>' in rendered
    assert "<h" not in rendered and "<ul>" in rendered  # still the Markdown's structure


def test_a_tinted_code_block_copies_its_code_without_the_tint():
    text = "```\nprint('hi')\n```\n"
    runs = [[len(text), "lookup"]]
    blocks: list[str] = []
    html = markdown_html(text, blocks, runs, COLORS)
    assert blocks == ["print('hi')\n"] and "#ff0000" in html


def test_the_store_migrates_a_version_2_file_and_keeps_its_messages(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL,
                                    updated REAL NOT NULL, overrides TEXT NOT NULL DEFAULT '{}');
        CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL, role TEXT NOT NULL,
                               content TEXT NOT NULL, created REAL NOT NULL,
                               stats TEXT NOT NULL DEFAULT '{}', complete INTEGER NOT NULL DEFAULT 1);
        CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO conversations VALUES (1, 'old chat', 0, 0, '{}');
        INSERT INTO messages VALUES (1, 1, 'user', 'hello', 0, '{}', 1);
        PRAGMA user_version = 2;
        """
    )
    db.close()
    store = Store(path)
    assert store.version == SCHEMA_VERSION
    conv = store.conversation(1)
    assert conv.title == "old chat" and conv.context_from == 0
    (msg,) = store.messages(1)
    assert msg.content == "hello" and msg.sources == []
    mid = store.add_message(1, "assistant", "", complete=False).id
    store.update_message(mid, "abc", sources=[[1, ""], [2, "lookup"]])
    store.set_context_from(1, mid)
    assert store.messages(1)[-1].sources == [[1, ""], [2, "lookup"]]
    store.delete_message(mid)  # the window's first message is gone: it starts over
    assert store.conversation(1).context_from == 0
