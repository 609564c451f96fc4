"""Conversations on disk: SQLite in WAL mode with numbered migrations (PRAGMA user_version).
An answer is saved as it streams, so a crash loses at most its last second; a database that
cannot be read is moved aside (never deleted) and a new one started."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

MIGRATIONS = [  # MIGRATIONS[i] takes the schema from version i to i + 1
    """
    CREATE TABLE conversation (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        model TEXT NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        sampling TEXT NOT NULL DEFAULT '{}',     -- JSON: temperature, seed, top_k, top_p, min_p
        drafter TEXT NOT NULL DEFAULT 'auto',
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE message (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversation(id) ON DELETE CASCADE,
        role TEXT NOT NULL,                      -- user | assistant
        text TEXT NOT NULL,
        pieces TEXT NOT NULL DEFAULT '[]',       -- JSON [[text, drafter or null], ...]
        stats TEXT NOT NULL DEFAULT '{}',        -- JSON, llama-server's names
        stopped INTEGER NOT NULL DEFAULT 0,      -- the user stopped it (or it was cut short)
        created REAL NOT NULL
    );
    CREATE INDEX message_by_conversation ON message(conversation_id, id);
    CREATE TABLE setting (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    """,
]


@dataclass
class Conversation:
    id: int
    title: str
    model: str
    system_prompt: str = ""
    sampling: dict = field(default_factory=dict)
    drafter: str = "auto"
    updated: float = 0.0


@dataclass
class Message:
    id: int
    role: str
    text: str
    pieces: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    stopped: bool = False


class Store:
    def __init__(self, path: Path):
        """Open (or start) the database at `path`. `moved_aside` names where an unreadable one
        went."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.moved_aside: Path | None = None
        try:
            self.db = self._open()
        except sqlite3.DatabaseError:
            self.moved_aside = self._move_aside()
            self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA foreign_keys = ON")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise sqlite3.DatabaseError(f"schema version {version} is newer than this localspec")
            for i in range(version, len(MIGRATIONS)):
                with db:
                    db.executescript(MIGRATIONS[i])
                    db.execute(f"PRAGMA user_version = {i + 1}")
            db.execute("SELECT count(*) FROM conversation").fetchone()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.unreadable-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            part = Path(str(self.path) + suffix)
            if part.exists():
                part.rename(Path(str(aside) + suffix))
        return aside

    def close(self) -> None:
        self.db.close()

    # --- conversations ----------------------------------------------------------------------

    def new_conversation(self, model: str, system_prompt: str = "", sampling: dict | None = None,
                         drafter: str = "auto") -> Conversation:
        now = time.time()
        with self.db:
            cur = self.db.execute(
                "INSERT INTO conversation (model, system_prompt, sampling, drafter, created, updated) "
                "VALUES (?, ?, ?, ?, ?, ?)", (model, system_prompt, json.dumps(sampling or {}), drafter, now, now))
        return self.conversation(cur.lastrowid)

    def conversation(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute("SELECT id, title, model, system_prompt, sampling, drafter, updated "
                              "FROM conversation WHERE id = ?", (conversation_id,)).fetchone()
        return None if row is None else Conversation(row[0], row[1], row[2], row[3], json.loads(row[4]),
                                                     row[5], row[6])

    def conversations(self) -> list[Conversation]:
        """Most recently updated first."""
        ids = self.db.execute("SELECT id FROM conversation ORDER BY updated DESC, id DESC").fetchall()
        return [self.conversation(i) for (i,) in ids]

    def update_conversation(self, c: Conversation) -> None:
        with self.db:
            self.db.execute("UPDATE conversation SET title = ?, model = ?, system_prompt = ?, sampling = ?, "
                            "drafter = ?, updated = ? WHERE id = ?",
                            (c.title, c.model, c.system_prompt, json.dumps(c.sampling), c.drafter,
                             time.time(), c.id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM conversation WHERE id = ?", (conversation_id,))

    # --- messages ---------------------------------------------------------------------------

    def messages(self, conversation_id: int) -> list[Message]:
        rows = self.db.execute("SELECT id, role, text, pieces, stats, stopped FROM message "
                               "WHERE conversation_id = ? ORDER BY id", (conversation_id,)).fetchall()
        return [Message(r[0], r[1], r[2], json.loads(r[3]), json.loads(r[4]), bool(r[5])) for r in rows]

    def add_message(self, conversation_id: int, role: str, text: str) -> Message:
        now = time.time()
        with self.db:
            cur = self.db.execute("INSERT INTO message (conversation_id, role, text, created) VALUES (?, ?, ?, ?)",
                                  (conversation_id, role, text, now))
            self.db.execute("UPDATE conversation SET updated = ? WHERE id = ?", (now, conversation_id))
        return Message(cur.lastrowid, role, text)

    def save_message(self, m: Message) -> None:
        """Write what `m` holds now (an answer as it streams, then as it ended)."""
        with self.db:
            self.db.execute("UPDATE message SET text = ?, pieces = ?, stats = ?, stopped = ? WHERE id = ?",
                            (m.text, json.dumps(m.pieces), json.dumps(m.stats), int(m.stopped), m.id))

    def delete_message(self, message_id: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM message WHERE id = ?", (message_id,))

    # --- where the app was left --------------------------------------------------------------

    def setting(self, key: str, default: str | None = None) -> str | None:
        row = self.db.execute("SELECT value FROM setting WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def set_setting(self, key: str, value: str) -> None:
        with self.db:
            self.db.execute("INSERT INTO setting (key, value) VALUES (?, ?) "
                            "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))
