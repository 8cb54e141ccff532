"""Conversations, messages and settings in SQLite (platformdirs' user data dir; KWKER_DATA_DIR
overrides it).

Every change is one transaction (WAL journal; a change of several statements, a fork say, is all
or nothing), and the answer being streamed is written as its tokens arrive, so a crash loses at most
the token in flight. A write waits at most LOCK_WAIT_S for another process's lock, so the GUI
thread never stalls on it; a write that fails (locked, disk full, read-only) raises
sqlite3.Error, and the window keeps what it could not write (kwker.app.saving). The schema carries
a version; `migrate` brings an older file up. A file that is not a database, or a damaged one,
raises DamagedStore: the app offers to set it aside (set_aside) and start a fresh one.

A conversation is a tree of messages (each names its parent), so that nothing is lost when the user
goes back: regenerating adds a sibling answer, editing a message adds a sibling question, and the
conversation's leaf names the branch on screen (its path from the root). Switching to another
version of a message goes down from it along the children chosen last, so a branch comes back as
it was left.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

SCHEMA_VERSION = 6
# How long a write waits for another process's lock: the GUI thread waits, and must not for 50 ms.
# SQLite's busy handler sleeps in steps (1, 2, 5, 10, 15, 20 ms...): 0.04 s gave writes of up to
# 55 ms under a held lock (tests/app/test_store_faults.py); a refused write is retried later.
LOCK_WAIT_S = 0.02


class DamagedStore(RuntimeError):
    """The chats file cannot be read as Kwker's database."""


# Each migration takes the database from version i to i + 1.
MIGRATIONS = [
    """
    CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL,
                                updated REAL NOT NULL);
    CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL REFERENCES conversations(id)
                           ON DELETE CASCADE, role TEXT NOT NULL, content TEXT NOT NULL, created REAL NOT NULL);
    CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
    """
    ALTER TABLE conversations ADD COLUMN overrides TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE messages ADD COLUMN stats TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE messages ADD COLUMN complete INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
    """,
    # context_from: the id of the first message the model still sees (0: all of them), as the
    # rolling window left it; sources: which runs of an answer's text came from speculation
    """
    ALTER TABLE conversations ADD COLUMN context_from INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE messages ADD COLUMN sources TEXT NOT NULL DEFAULT '[]';
    """,
    # branches: parent_id (NULL at the root), chosen (when the message was last put on screen: the
    # child a branch goes down by) and the conversation's leaf (0: no messages); a version 3 history
    # is one branch, each message the child of the one before it. attachments: documents a
    # conversation answers from (their text, extracted once, and its length in the model's tokens)
    """
    ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE;
    ALTER TABLE messages ADD COLUMN chosen REAL NOT NULL DEFAULT 0;
    ALTER TABLE conversations ADD COLUMN leaf_id INTEGER NOT NULL DEFAULT 0;
    UPDATE messages SET chosen = created, parent_id = (
        SELECT MAX(p.id) FROM messages p
        WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id);
    UPDATE conversations SET leaf_id = COALESCE(
        (SELECT MAX(id) FROM messages WHERE conversation_id = conversations.id), 0);
    CREATE INDEX messages_by_parent ON messages(parent_id);
    CREATE TABLE attachments (id INTEGER PRIMARY KEY, conversation_id INTEGER NOT NULL
                              REFERENCES conversations(id) ON DELETE CASCADE, name TEXT NOT NULL,
                              text TEXT NOT NULL, tokens INTEGER NOT NULL, created REAL NOT NULL);
    """,
    # thinking models (kwker.thinking): an answer's thinking, apart from its text (never sent
    # back as the answer), and whether the conversation asks the model to think (its Think
    # toggle; on, as the models' templates default)
    """
    ALTER TABLE messages ADD COLUMN thinking TEXT NOT NULL DEFAULT '';
    ALTER TABLE conversations ADD COLUMN think INTEGER NOT NULL DEFAULT 1;
    """,
    # tools (kwker.app.tool_calls): the calls an answer made, each with its arguments, result and
    # place in the answer's text, in order
    "ALTER TABLE messages ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '[]'",
]


def data_dir() -> Path:
    path = Path(os.environ.get("KWKER_DATA_DIR") or platformdirs.user_data_dir("kwker"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Message:
    id: int
    role: str
    content: str
    stats: dict = field(default_factory=dict)
    complete: bool = True
    # [[characters, source], ...] over content: runs of text from "lookup" or "draft" proposals the
    # model accepted, or from the model's own steps ("")
    sources: list = field(default_factory=list)
    parent_id: int | None = None  # None at the root
    created: float = 0.0
    version: int = 1  # its place among its versions (the children of its parent), from 1
    versions: int = 1
    thinking: str = ""  # a thinking model's thinking before the answer (content)
    tool_calls: list = field(default_factory=list)  # its tool calls (kwker.app.tool_calls)


@dataclass
class Attachment:
    id: int
    name: str  # the file's name
    text: str  # its text (a PDF's text layer)
    # its length in the model's tokens when attached; negative when it is an estimate from its
    # characters (no tokenizer at hand: a server's model, or none loaded yet)
    tokens: int

    @property
    def about(self) -> str:
        """Its length as the window shows it: "1,234 tokens", "≈1,234 tokens" for an estimate."""
        return f"≈{-self.tokens:,} tokens" if self.tokens < 0 else f"{self.tokens:,} tokens"


@dataclass
class Conversation:
    id: int
    title: str
    updated: float
    overrides: dict = field(default_factory=dict)
    context_from: int = 0  # the first message id the model still sees (0: all; see context_window)
    leaf_id: int = 0  # the last message of the branch on screen (0: no messages)
    think: bool = True  # a thinking model thinks before answering (the Think toggle)


class Store:
    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else data_dir() / "chats.db"
        self.db = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=LOCK_WAIT_S
        )
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            if self.db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("its integrity check failed")
            self.migrate()
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise DamagedStore(f"{self.path} cannot be read: {e}") from e

    @staticmethod
    def set_aside(path: Path) -> Path:
        """Renames a damaged chats file (and its journal) out of the way; returns its new name."""
        aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
        for suffix in ("-wal", "-shm"):
            journal = path.with_name(path.name + suffix)
            if journal.exists():
                journal.rename(aside.with_name(aside.name + suffix))
        path.rename(aside)
        return aside

    @contextlib.contextmanager
    def _tx(self):
        """One transaction: every statement in it lands, or none (BEGIN IMMEDIATE takes the write
        lock at once, so a lock held elsewhere fails here, before anything is written)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            # SQLite may have rolled back already (a full disk does: SQLITE_FULL), and then a
            # ROLLBACK's own error would hide the one that says what happened
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                self.db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.db.close()

    @property
    def version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def migrate(self) -> None:
        version = self.version
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"{self.path} was written by a newer Kwker (schema {version} > {SCHEMA_VERSION})"
            )
        for i in range(version, SCHEMA_VERSION):
            with self._tx():
                for statement in MIGRATIONS[i].split(";"):
                    if statement.strip():
                        self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {i + 1}")

    # -------------------------------------------------------------------------------- conversations
    def new_conversation(self, title: str = "New chat") -> Conversation:
        now = time.time()
        with self._tx():
            cur = self.db.execute(
                "INSERT INTO conversations (title, created, updated) VALUES (?, ?, ?)",
                (title, now, now),
            )
        return Conversation(cur.lastrowid, title, now)

    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches titles and message text."""
        query = f"SELECT {_CONVERSATION} FROM conversations"
        args: tuple = ()
        if search:
            query += " WHERE title LIKE ? OR id IN (SELECT conversation_id FROM messages WHERE content LIKE ?)"
            args = (f"%{search}%", f"%{search}%")
        rows = self.db.execute(query + " ORDER BY updated DESC, id DESC", args).fetchall()
        return [_conversation(r) for r in rows]

    def conversation(self, cid: int) -> Conversation:
        r = self.db.execute(
            f"SELECT {_CONVERSATION} FROM conversations WHERE id = ?", (cid,)
        ).fetchone()
        if r is None:
            raise KeyError(cid)
        return _conversation(r)

    def rename(self, cid: int, title: str) -> None:
        with self._tx():
            self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, cid))

    def delete(self, cid: int) -> None:
        with self._tx():
            self.db.execute("DELETE FROM conversations WHERE id = ?", (cid,))

    def set_overrides(self, cid: int, overrides: dict) -> None:
        with self._tx():
            self.db.execute(
                "UPDATE conversations SET overrides = ? WHERE id = ?", (json.dumps(overrides), cid)
            )

    def set_think(self, cid: int, think: bool) -> None:
        with self._tx():
            self.db.execute("UPDATE conversations SET think = ? WHERE id = ?", (int(think), cid))

    def set_context_from(self, cid: int, mid: int) -> None:
        with self._tx():
            self.db.execute("UPDATE conversations SET context_from = ? WHERE id = ?", (mid, cid))

    # ------------------------------------------------------------------------------------- messages
    def _rows(self, cid: int) -> dict[int, tuple]:
        rows = self.db.execute(
            f"SELECT {_MESSAGE} FROM messages WHERE conversation_id = ?", (cid,)
        ).fetchall()
        return {r[0]: r for r in rows}

    def messages(self, cid: int) -> list[Message]:
        """The branch on screen: the path from the root to the conversation's leaf, each message
        with its place among its versions."""
        rows = self._rows(cid)
        path, mid = [], self.conversation(cid).leaf_id
        while mid in rows:
            path.append(rows[mid])
            mid = rows[mid][6]
        siblings: dict[int | None, list[int]] = {}
        for r in sorted(rows.values()):
            siblings.setdefault(r[6], []).append(r[0])
        out = []
        for r in reversed(path):
            versions = siblings[r[6]]
            out.append(_message(r, versions.index(r[0]) + 1, len(versions)))
        return out

    def tree(self, cid: int) -> list[Message]:
        """Every message of every branch, oldest first (each names its parent)."""
        return [_message(r) for r in sorted(self._rows(cid).values())]

    def add_message(self, cid: int, role: str, content: str, complete: bool = True) -> Message:
        """A message after the conversation's leaf, which it becomes (set_leaf first to branch off
        an earlier message)."""
        now = time.time()
        parent = self.conversation(cid).leaf_id or None
        with self._tx():
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, role, content, created, complete, "
                "parent_id, chosen) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (cid, role, content, now, int(complete), parent, now),
            )
            self.db.execute(
                "UPDATE conversations SET updated = ?, leaf_id = ? WHERE id = ?",
                (now, cur.lastrowid, cid),
            )
        return Message(cur.lastrowid, role, content, {}, complete, [], parent, now)

    def set_leaf(self, cid: int, mid: int | None) -> None:
        """Puts the branch ending at message `mid` on screen (0 or None: none, the next message
        starts a new root); its messages become the children a branch goes down by."""
        rows = self._rows(cid)
        path, m = [], mid
        while m in rows:
            path.append(m)
            m = rows[m][6]
        with self._tx():
            self.db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (mid or 0, cid))
            self.db.executemany(
                "UPDATE messages SET chosen = ? WHERE id = ?", [(time.time(), p) for p in path]
            )

    def switch_version(self, cid: int, mid: int, step: int) -> None:
        """Shows the version `step` places from message `mid` among its siblings (the "< 2/3 >"
        switcher), with the branch under it as it was last seen."""
        rows = self._rows(cid)
        parent = rows[mid][6]
        siblings = sorted(r[0] for r in rows.values() if r[6] == parent)
        i = min(max(siblings.index(mid) + step, 0), len(siblings) - 1)
        leaf = siblings[i]
        while True:  # down along the child chosen last
            children = [r for r in rows.values() if r[6] == leaf]
            if not children:
                break
            leaf = max(children, key=lambda r: (r[8], r[0]))[0]
        self.set_leaf(cid, leaf)

    def fork(self, cid: int, mid: int) -> Conversation:
        """A new conversation with copies of the branch on screen up to message `mid` (its
        attachments and settings too); the original is left as it is."""
        conv = self.conversation(cid)
        path = self.messages(cid)
        path = path[: next(i for i, m in enumerate(path) if m.id == mid) + 1]
        now = time.time()
        with self._tx():
            new = self.db.execute(
                "INSERT INTO conversations (title, created, updated, overrides, think) "
                "VALUES (?, ?, ?, ?, ?)",
                (f"{conv.title} (fork)", now, now, json.dumps(conv.overrides), int(conv.think)),
            ).lastrowid
            parent = None
            for m in path:
                parent = self.db.execute(
                    "INSERT INTO messages (conversation_id, role, content, created, complete, "
                    "stats, sources, parent_id, chosen, thinking, tool_calls) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (new, m.role, m.content, m.created, int(m.complete), json.dumps(m.stats),
                     json.dumps(m.sources), parent, now, m.thinking, json.dumps(m.tool_calls)),
                ).lastrowid  # fmt: skip
            self.db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (parent or 0, new))
            self.db.execute(
                "INSERT INTO attachments (conversation_id, name, text, tokens, created) "
                "SELECT ?, name, text, tokens, created FROM attachments WHERE conversation_id = ?",
                (new, cid),
            )
        return self.conversation(new)

    def update_message(
        self,
        mid: int,
        content: str,
        stats: dict | None = None,
        complete: bool | None = None,
        sources: list | None = None,
        thinking: str | None = None,
        tool_calls: list | None = None,
    ):
        """One transaction per call: the streamed answer is saved as it grows."""
        sets, args = ["content = ?"], [content]
        if tool_calls is not None:
            sets.append("tool_calls = ?")
            args.append(json.dumps(tool_calls))
        if thinking is not None:
            sets.append("thinking = ?")
            args.append(thinking)
        if sources is not None:
            sets.append("sources = ?")
            args.append(json.dumps(sources))
        if stats is not None:
            sets.append("stats = ?")
            args.append(json.dumps(stats))
        if complete is not None:
            sets.append("complete = ?")
            args.append(int(complete))
        with self._tx():
            self.db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*args, mid))

    def delete_message(self, mid: int) -> None:
        """Deletes a message and the branches under it; a leaf among them moves up to its parent,
        and a rolling window that started among them starts over."""
        row = self.db.execute(
            "SELECT conversation_id, parent_id FROM messages WHERE id = ?", (mid,)
        ).fetchone()
        if row is None:
            return
        cid, parent = row
        with self._tx():
            self.db.execute("DELETE FROM messages WHERE id = ?", (mid,))  # cascades to children
            gone = "NOT IN (SELECT id FROM messages)"
            self.db.execute(
                f"UPDATE conversations SET leaf_id = ? WHERE id = ? AND leaf_id {gone}",
                (parent or 0, cid),
            )
            self.db.execute(
                f"UPDATE conversations SET context_from = 0 WHERE id = ? AND context_from {gone}",
                (cid,),
            )

    # ---------------------------------------------------------------------------------- attachments
    def add_attachment(self, cid: int, name: str, text: str, tokens: int) -> Attachment:
        with self._tx():
            cur = self.db.execute(
                "INSERT INTO attachments (conversation_id, name, text, tokens, created) "
                "VALUES (?, ?, ?, ?, ?)",
                (cid, name, text, tokens, time.time()),
            )
        return Attachment(cur.lastrowid, name, text, tokens)

    def attachments(self, cid: int) -> list[Attachment]:
        rows = self.db.execute(
            "SELECT id, name, text, tokens FROM attachments WHERE conversation_id = ? ORDER BY id",
            (cid,),
        )
        return [Attachment(*r) for r in rows]

    def remove_attachment(self, aid: int) -> None:
        with self._tx():
            self.db.execute("DELETE FROM attachments WHERE id = ?", (aid,))

    # ------------------------------------------------------------------------------------- settings
    def settings(self) -> dict:
        return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM settings")}

    def save_settings(self, values: dict) -> None:
        with self._tx():
            self.db.executemany(
                "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                "value = excluded.value",
                [(k, json.dumps(v)) for k, v in values.items()],
            )

    def forget_settings(self, keys) -> None:
        """Drops saved settings: they follow the defaults (the model's preset) again."""
        with self._tx():
            self.db.executemany("DELETE FROM settings WHERE key = ?", [(k,) for k in keys])


_CONVERSATION = "id, title, updated, overrides, context_from, leaf_id, think"
_MESSAGE = (
    "id, role, content, stats, complete, sources, parent_id, created, chosen, thinking, tool_calls"
)


def _conversation(r) -> Conversation:
    return Conversation(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], bool(r[6]))


def _message(r, version: int = 1, versions: int = 1) -> Message:
    return Message(
        r[0], r[1], r[2], json.loads(r[3]), bool(r[4]), json.loads(r[5]), r[6], r[7],
        version, versions, r[9], json.loads(r[10]),
    )  # fmt: skip
