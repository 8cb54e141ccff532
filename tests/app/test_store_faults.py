"""Faults of the chats database, in the real window offscreen: each ends the answer cleanly with a
message, keeps what was streamed, and leaves the window usable; once the fault goes, what waited
is saved.

The faults are SQLite's own: a full disk is `PRAGMA max_page_count` set to the pages in use (SQLite
then answers SQLITE_FULL, "database or disk is full", as on a full disk), a lock is a second
connection's BEGIN EXCLUSIVE, a read-only database is the store's connection reopened with
`mode=ro`. A damaged file is bytes overwritten on disk."""

import sqlite3
import time

from app_helpers import answer, open_window

from kwker.app import open_store
from kwker.app.store import Store

LONG = {"max_new_tokens": 200}


def fill_disk(store) -> int:
    """No page more for this database, and the room left in its pages taken: by filler rows, and
    by a padding conversation's messages (a table's rows go only in its own pages). From here on
    every write that needs room fails with SQLITE_FULL. Returns the padding conversation's id."""
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    padding = store.new_conversation("padding").id
    store.db.execute("CREATE TABLE IF NOT EXISTS filler (x BLOB)")
    store.db.execute(f"PRAGMA max_page_count = {pages + 1}")
    # big rows first, then the crumbs of room between them; twice, as a failed write's pages go
    # back to the free list
    for size in (4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8) * 2:
        for write in (
            lambda size=size: store.db.execute("INSERT INTO filler VALUES (zeroblob(?))", (size,)),
            lambda size=size: store.add_message(padding, "user", "p" * size),
        ):
            try:
                while True:
                    write()
            except sqlite3.OperationalError as e:
                assert "full" in str(e)
    return padding


def free_disk(store, padding: int) -> None:
    store.db.execute("PRAGMA max_page_count = 1073741823")
    store.db.execute("DROP TABLE filler")
    store.delete(padding)


def stored_answer(store, cid):
    return [m for m in store.messages(cid) if m.role == "assistant"][-1]


def test_a_full_disk_mid_answer_ends_it_cleanly_and_saves_it_once_freed(qtbot, data_dir):
    win = open_window(qtbot, LONG)
    assert win.send("Write a long story about a lighthouse keeper.")
    qtbot.waitUntil(lambda: len(win.stream_text) > 40, timeout=60_000)
    padding = fill_disk(win.store)
    # the answer grows past what its pages hold: its saves fail from here on
    qtbot.waitUntil(lambda: not win.generating, timeout=120_000)
    shown = win.messages[-1]
    assert shown.role == "assistant" and shown.content == win.stream_text  # kept on screen
    assert len(shown.content) > 40
    assert "could not be saved" in win.status.text() and "full" in win.status.text()
    assert "could not be saved" in win.view.toPlainText()  # said in the chat too
    free_disk(win.store, padding)
    qtbot.waitUntil(lambda: not win.answer.writer.pending, timeout=10_000)  # the retry timer
    saved = stored_answer(Store(), win.cid)  # another connection reads what is on disk
    assert saved.content == shown.content and saved.complete
    assert answer(qtbot, win, "Thanks!").content  # usable again


def test_a_message_refused_by_a_full_disk_stays_in_the_input(qtbot, data_dir):
    win = open_window(qtbot)
    padding = fill_disk(win.store)
    win.input.setPlainText("Hello? " * 400)  # more than the free room of the last page
    win.send_or_stop()
    assert not win.generating
    assert win.input.toPlainText().startswith("Hello?")  # nothing typed is lost
    assert "could not be saved" in win.status.text()
    free_disk(win.store, padding)
    win.send_or_stop()
    qtbot.waitUntil(lambda: not win.generating, timeout=60_000)
    assert [m.role for m in Store().messages(win.cid)] == ["user", "assistant"]


def test_a_locked_database_never_holds_the_window_and_loses_nothing(qtbot, data_dir):
    win = open_window(qtbot, LONG)
    took = []
    update = win.store.update_message

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return update(*args, **kwargs)
        finally:
            took.append(time.perf_counter() - started)

    win.store.update_message = timed
    other = sqlite3.connect(data_dir / "chats.db", isolation_level=None)
    assert win.send("Write a long story about a lighthouse keeper.")
    qtbot.waitUntil(lambda: len(win.stream_text) > 20, timeout=60_000)
    other.execute("BEGIN EXCLUSIVE")  # another process holds the lock from here on
    locked_from = len(took)
    qtbot.waitUntil(lambda: not win.generating, timeout=120_000)
    assert len(took) > locked_from  # writes were tried while locked
    assert max(took[locked_from:]) < 0.05  # none held the GUI thread for 50 ms
    assert win.answer.writer.pending  # what was refused waits, on screen
    other.execute("ROLLBACK")
    qtbot.waitUntil(lambda: not win.answer.writer.pending, timeout=10_000)
    assert stored_answer(Store(), win.cid).content == win.messages[-1].content
    other.close()


def test_a_read_only_database_ends_the_answer_with_a_message(qtbot, data_dir):
    win = open_window(qtbot, LONG)
    assert win.send("Write a long story about a lighthouse keeper.")
    qtbot.waitUntil(lambda: len(win.stream_text) > 20, timeout=60_000)
    writable = win.store.db
    # the folder became read-only: the store's connection can read, not write
    win.store.db = sqlite3.connect(
        f"file:{data_dir / 'chats.db'}?mode=ro", uri=True, isolation_level=None,
        check_same_thread=False,
    )  # fmt: skip
    qtbot.waitUntil(lambda: not win.generating, timeout=120_000)
    assert "could not be saved" in win.status.text() and "readonly" in win.status.text()
    assert len(win.messages[-1].content) > 20
    win.store.db.close()
    win.store.db = writable
    qtbot.waitUntil(lambda: not win.answer.writer.pending, timeout=10_000)
    assert stored_answer(Store(), win.cid).content == win.messages[-1].content


def test_a_fork_on_a_full_disk_leaves_no_half_conversation(qtbot, data_dir):
    win = open_window(qtbot)
    answer(qtbot, win, "What is the capital of France?")
    answer(qtbot, win, "And of Italy?")
    before = [(c.id, c.title) for c in win.store.conversations()]
    cid = win.cid
    # forked with the chat: more than the free room of the pages in use
    win.store.add_attachment(cid, "notes.txt", "a line of notes\n" * 2000, 8000)
    padding = fill_disk(win.store)
    assert win.branches.fork_from(len(win.messages) - 1) is None
    assert "could not fork" in win.status.text() and "full" in win.status.text()
    assert win.cid == cid  # the conversation stays open
    free_disk(win.store, padding)
    assert [(c.id, c.title) for c in Store().conversations()] == before  # nothing half-made
    forked = win.branches.fork_from(len(win.messages) - 1)  # room again: a whole fork
    assert [m.content for m in win.store.messages(forked)] == [m.content for m in win.messages]


def test_a_damaged_database_is_set_aside_for_a_fresh_one(qtbot, data_dir):
    store = Store()
    store.add_message(store.new_conversation().id, "user", "keep me")
    store.close()
    path = data_dir / "chats.db"
    damaged = bytearray(path.read_bytes())
    damaged[100:4096] = b"\x5a" * (4096 - 100)  # the schema's page, overwritten
    path.write_bytes(bytes(damaged))
    asked = []

    def refuse(message):
        asked.append(message)
        return False

    assert open_store(ask=refuse) is None
    assert asked and "cannot read its chats file" in asked[0]
    assert path.read_bytes() == bytes(damaged)  # refused: untouched
    fresh = open_store(ask=lambda message: True)
    assert fresh is not None and fresh.conversations() == []
    aside = [p for p in data_dir.iterdir() if p.name.startswith("chats.db.") and p != path]
    assert any(p.read_bytes() == bytes(damaged) for p in aside)  # kept, never deleted
