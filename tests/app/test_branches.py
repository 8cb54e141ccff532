"""Conversation branches (issue 24): regenerating keeps every version of an answer, editing a
message branches off there, "Fork from here" copies a branch into a new conversation; all of it in
SQLite (schema 4, migrated from 3) and across a restart; the KV cache is reused along the prefix a
branch shares with the one before."""

import sqlite3

import pytest
from app_helpers import answer, open_window

from kwker.app.store import SCHEMA_VERSION, Store

# The schema as version 3 of the store wrote it (its three migrations, as they were): the
# migration is tested from a file that version made, not from today's code.
V3_DDL = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL,
                            updated REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL REFERENCES conversations(id)
                       ON DELETE CASCADE, role TEXT NOT NULL, content TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
ALTER TABLE conversations ADD COLUMN overrides TEXT NOT NULL DEFAULT '{}';
ALTER TABLE messages ADD COLUMN stats TEXT NOT NULL DEFAULT '{}';
ALTER TABLE messages ADD COLUMN complete INTEGER NOT NULL DEFAULT 1;
CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
ALTER TABLE conversations ADD COLUMN context_from INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN sources TEXT NOT NULL DEFAULT '[]';
PRAGMA user_version = 3;
"""


def v3_database(path):
    """A version 3 file with two conversations whose messages interleave by id (written turn by
    turn into both), one with statistics, sources, an interrupted answer and a rolling window."""
    db = sqlite3.connect(path)
    db.executescript(V3_DDL)
    db.executescript(
        """
        INSERT INTO conversations VALUES (1, 'geography', 1, 9, '{"seed": 5}', 3);
        INSERT INTO conversations VALUES (2, 'empty', 2, 2, '{}', 0);
        INSERT INTO conversations VALUES (3, 'colours', 3, 8, '{}', 0);
        INSERT INTO messages VALUES (1, 1, 'user', 'What is the capital of France?', 1, '{}', 1, '[]');
        INSERT INTO messages VALUES (2, 3, 'user', 'Name a colour.', 2, '{}', 1, '[]');
        INSERT INTO messages VALUES (3, 1, 'assistant', 'Paris.', 3, '{"tokens_per_s": 90.5}', 1,
                                     '[[2, ""], [4, "lookup"]]');
        INSERT INTO messages VALUES (4, 3, 'assistant', 'Blue.', 4, '{}', 1, '[]');
        INSERT INTO messages VALUES (5, 1, 'user', 'And of Italy?', 5, '{}', 1, '[]');
        INSERT INTO messages VALUES (6, 1, 'assistant', 'Ro', 6, '{}', 0, '[]');
        """
    )
    db.commit()
    db.close()


def test_a_version_3_file_migrates_with_every_message_on_one_branch(tmp_path):
    path = tmp_path / "chats.db"
    v3_database(path)
    before = sqlite3.connect(path).execute("SELECT * FROM messages ORDER BY id").fetchall()
    store = Store(path)
    assert store.version == SCHEMA_VERSION == 6
    assert all(m.tool_calls == [] for m in store.tree(1))  # version 6: no calls before
    geo = store.messages(1)
    assert [(m.id, m.role, m.content) for m in geo] == [
        (1, "user", "What is the capital of France?"),
        (3, "assistant", "Paris."),
        (5, "user", "And of Italy?"),
        (6, "assistant", "Ro"),
    ]
    assert [m.parent_id for m in geo] == [None, 1, 3, 5]
    assert all(m.versions == 1 for m in geo)
    assert geo[1].stats == {"tokens_per_s": 90.5} and geo[1].sources == [[2, ""], [4, "lookup"]]
    assert not geo[3].complete
    assert [m.content for m in store.messages(3)] == ["Name a colour.", "Blue."]
    assert store.messages(2) == [] and store.conversation(2).leaf_id == 0
    conv = store.conversation(1)
    assert conv.overrides == {"seed": 5} and conv.context_from == 3 and conv.leaf_id == 6
    # version 5: no answer had thinking, and a conversation lets a thinking model think
    assert all(m.thinking == "" for m in store.tree(1)) and conv.think
    # every column of every message survives as it was
    after = store.db.execute(
        "SELECT id, conversation_id, role, content, created, stats, complete, sources FROM messages "
        "ORDER BY id"
    ).fetchall()
    assert after == before
    assert store.attachments(1) == []
    store.close()
    assert Store(path).messages(1) == geo  # and once more: nothing migrates twice


def test_versions_edits_forks_and_deletes_in_the_store(tmp_path):
    store = Store(tmp_path / "chats.db")
    cid = store.new_conversation().id
    q1 = store.add_message(cid, "user", "q1")
    a1 = store.add_message(cid, "assistant", "a1")
    store.set_leaf(cid, q1.id)  # regenerate: a second answer to q1
    a1b = store.add_message(cid, "assistant", "a1 again")
    q2 = store.add_message(cid, "user", "q2")
    shown = store.messages(cid)
    assert [m.content for m in shown] == ["q1", "a1 again", "q2"]
    assert (shown[1].version, shown[1].versions) == (2, 2)
    store.switch_version(cid, a1b.id, -1)
    assert [m.content for m in store.messages(cid)] == ["q1", "a1"]
    store.switch_version(cid, a1.id, +1)  # back: the branch under it as it was left
    assert [m.content for m in store.messages(cid)] == ["q1", "a1 again", "q2"]
    store.switch_version(cid, a1b.id, +5)  # past the end: stays on the last
    assert store.messages(cid)[-1].id == q2.id
    store.set_leaf(cid, None)  # an edit of the first message: a new root
    store.add_message(cid, "user", "q1 edited")
    first = store.messages(cid)[0]
    assert (first.content, first.version, first.versions) == ("q1 edited", 2, 2)
    store.switch_version(cid, first.id, -1)
    assert [m.content for m in store.messages(cid)] == ["q1", "a1 again", "q2"]

    fork = store.fork(cid, a1b.id)
    assert fork.title == "New chat (fork)"
    assert [m.content for m in store.messages(fork.id)] == ["q1", "a1 again"]
    assert [m.content for m in store.messages(cid)] == ["q1", "a1 again", "q2"]
    assert len(store.tree(cid)) == 5 and len(store.tree(fork.id)) == 2

    store.delete_message(a1b.id)  # with q2 under it: the leaf moves up to q1
    assert [m.content for m in store.messages(cid)] == ["q1"]
    assert [m.content for m in store.messages(fork.id)] == ["q1", "a1 again"]


# -------------------------------------------------------------------------------- the real window
@pytest.mark.slow
def test_versions_survive_a_restart_and_switching_reuses_the_kv_cache(qtbot, data_dir):
    win = open_window(qtbot, {"temperature": 0.9, "seed": 1, "max_new_tokens": 16})
    first = answer(qtbot, win, "Name a colour.").content
    contents = [first]
    for seed in (2, 3):
        win.apply_settings({**win.settings_panel.values(), "seed": seed}, conversation_only=True)
        win.branches.regenerate()
        qtbot.waitUntil(lambda: not win.generating, timeout=60_000)
        contents.append(win.messages[-1].content)
        # the prompt was the one of the answer before: all of it came from the KV cache but the
        # token the runner computes again to get the next token's logits
        stats = win.messages[-1].stats
        assert stats["reused_prompt_tokens"] >= stats["prompt_tokens"] - 1, stats
    assert len(set(contents)) == 3, contents  # three seeds, three versions
    shown = win.messages[-1]
    assert (shown.version, shown.versions) == (3, 3)
    assert "< 3/3 >" in win.view.toPlainText()
    win.branches.switch_version(1, -1)
    assert win.messages[-1].content == contents[1] and "< 2/3 >" in win.view.toPlainText()
    follow = answer(qtbot, win, "And a fruit?")  # on version 2's branch
    stats = follow.stats
    # the shared prefix (the system turn and "Name a colour.") stayed in the cache; only the
    # assistant's version changed, and what follows it
    assert stats["reused_prompt_tokens"] > 10, stats
    cid = win.cid
    win.close()

    again = open_window(qtbot, keep_saved=True)
    assert again.cid == cid
    assert [m.content for m in again.messages] == ["Name a colour.", contents[1], "And a fruit?",
                                                   follow.content]  # fmt: skip
    assert (again.messages[1].version, again.messages[1].versions) == (2, 3)
    again.branches.switch_version(1, +1)
    assert [m.content for m in again.messages][1:] == [contents[2]]
    again.branches.switch_version(1, -1)  # back to version 2: its follow-up is still there
    assert again.messages[-1].content == follow.content


@pytest.mark.slow
def test_editing_branches_off_and_a_fork_leaves_the_original_intact(qtbot, data_dir):
    win = open_window(qtbot)
    answer(qtbot, win, "What is the capital of France?")
    answer(qtbot, win, "Name a colour.")
    original = [(m.role, m.content) for m in win.messages]
    cid = win.cid

    win.branches.edit_message(2)
    win.send("Name a fruit.")
    qtbot.waitUntil(lambda: not win.generating, timeout=60_000)
    edited = win.messages[2]
    assert (edited.content, edited.version, edited.versions) == ("Name a fruit.", 2, 2)
    assert win.messages[3].stats["reused_prompt_tokens"] > 10  # the first turn, from the cache
    win.branches.switch_version(2, -1)
    assert [(m.role, m.content) for m in win.messages] == original  # the old branch is kept

    fork = win.branches.fork_from(1)
    assert win.cid == fork != cid and win.title.text().endswith("(fork)")
    assert [(m.role, m.content) for m in win.messages] == original[:2]
    follow = answer(qtbot, win, "And of Italy?")
    assert "Rome" in follow.content
    # the original: untouched by the fork and its new answer
    assert [(m.role, m.content) for m in win.store.messages(cid)] == original
    assert len(win.store.tree(cid)) == 6
    win.close()
    again = open_window(qtbot, keep_saved=True)
    assert [(m.role, m.content) for m in again.store.messages(cid)] == original
    assert [m.content for m in again.store.messages(fork)][-1] == follow.content
