"""Conversations, messages and settings in SQLite (platformdirs' user data dir; KWKER_DATA_DIR overrides it).

Every change is its own transaction (WAL journal), and the answer being streamed is written as its tokens arrive,
so a crash loses at most the token in flight. The schema carries a version; `migrate` brings an older file up.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

SCHEMA_VERSION = 3

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


@dataclass
class Conversation:
    id: int
    title: str
    updated: float
    overrides: dict = field(default_factory=dict)
    context_from: int = 0  # the first message id the model still sees (0: all; see context_window)


class Store:
    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else data_dir() / "chats.db"
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.migrate()

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
            with self.db:
                self.db.execute("BEGIN")
                for statement in MIGRATIONS[i].split(";"):
                    if statement.strip():
                        self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {i + 1}")

    # -------------------------------------------------------------------------------------------- conversations
    def new_conversation(self, title: str = "New chat") -> Conversation:
        now = time.time()
        with self.db:
            cur = self.db.execute(
                "INSERT INTO conversations (title, created, updated) VALUES (?, ?, ?)",
                (title, now, now),
            )
        return Conversation(cur.lastrowid, title, now)

    def conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches titles and message text."""
        query = "SELECT id, title, updated, overrides, context_from FROM conversations"
        args: tuple = ()
        if search:
            query += " WHERE title LIKE ? OR id IN (SELECT conversation_id FROM messages WHERE content LIKE ?)"
            args = (f"%{search}%", f"%{search}%")
        rows = self.db.execute(query + " ORDER BY updated DESC, id DESC", args).fetchall()
        return [Conversation(r[0], r[1], r[2], json.loads(r[3]), r[4]) for r in rows]

    def conversation(self, cid: int) -> Conversation:
        r = self.db.execute(
            "SELECT id, title, updated, overrides, context_from FROM conversations WHERE id = ?",
            (cid,),
        ).fetchone()
        if r is None:
            raise KeyError(cid)
        return Conversation(r[0], r[1], r[2], json.loads(r[3]), r[4])

    def rename(self, cid: int, title: str) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, cid))

    def delete(self, cid: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM conversations WHERE id = ?", (cid,))

    def set_overrides(self, cid: int, overrides: dict) -> None:
        with self.db:
            self.db.execute(
                "UPDATE conversations SET overrides = ? WHERE id = ?", (json.dumps(overrides), cid)
            )

    def set_context_from(self, cid: int, mid: int) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET context_from = ? WHERE id = ?", (mid, cid))

    # ---------------------------------------------------------------------------------------------- messages
    def messages(self, cid: int) -> list[Message]:
        rows = self.db.execute(
            "SELECT id, role, content, stats, complete, sources FROM messages "
            "WHERE conversation_id = ? ORDER BY id",
            (cid,),
        ).fetchall()
        return [
            Message(r[0], r[1], r[2], json.loads(r[3]), bool(r[4]), json.loads(r[5])) for r in rows
        ]

    def add_message(self, cid: int, role: str, content: str, complete: bool = True) -> Message:
        now = time.time()
        with self.db:
            cur = self.db.execute(
                "INSERT INTO messages (conversation_id, role, content, created, complete) "
                "VALUES (?, ?, ?, ?, ?)",
                (cid, role, content, now, int(complete)),
            )
            self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, cid))
        return Message(cur.lastrowid, role, content, {}, complete)

    def update_message(
        self,
        mid: int,
        content: str,
        stats: dict | None = None,
        complete: bool | None = None,
        sources: list | None = None,
    ):
        """One transaction per call: the streamed answer is saved as it grows."""
        sets, args = ["content = ?"], [content]
        if sources is not None:
            sets.append("sources = ?")
            args.append(json.dumps(sources))
        if stats is not None:
            sets.append("stats = ?")
            args.append(json.dumps(stats))
        if complete is not None:
            sets.append("complete = ?")
            args.append(int(complete))
        with self.db:
            self.db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id = ?", (*args, mid))

    def truncate_after(self, cid: int, mid: int, keep: bool) -> None:
        """Deletes the messages after `mid` (and mid itself unless keep): regenerate and edit start from there."""
        op = ">" if keep else ">="
        with self.db:
            self.db.execute(
                f"DELETE FROM messages WHERE conversation_id = ? AND id {op} ?", (cid, mid)
            )
            # a window that started at a deleted message starts over: the history is shorter now
            self.db.execute(
                f"UPDATE conversations SET context_from = 0 WHERE id = ? AND context_from {op} ?",
                (cid, mid),
            )

    def delete_message(self, mid: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM messages WHERE id = ?", (mid,))

    # ---------------------------------------------------------------------------------------------- settings
    def settings(self) -> dict:
        return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM settings")}

    def save_settings(self, values: dict) -> None:
        with self.db:
            self.db.executemany(
                "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET "
                "value = excluded.value",
                [(k, json.dumps(v)) for k, v in values.items()],
            )

    # ------------------------------------------------------------------------------------------------ export
    def export_markdown(self, cid: int) -> str:
        conv = self.conversation(cid)
        parts = [f"# {conv.title}\n"]
        for m in self.messages(cid):
            parts.append(f"**{m.role.capitalize()}:**\n\n{m.content}\n")
        return "\n".join(parts)

    def export_json(self, cid: int) -> str:
        conv = self.conversation(cid)
        return json.dumps(
            {
                "title": conv.title,
                "messages": [{"role": m.role, "content": m.content} for m in self.messages(cid)],
            },
            indent=2,
            ensure_ascii=False,
        )
