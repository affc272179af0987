"""A persistent response cache so a rerun never pays twice for the same request.

One sqlite file holds every response; the key is a sha256 over the backend
kind, the model identity, the messages and every sampling parameter (n,
temperature, max_tokens, seed, stop, JSON schema, ...), so changing any of them
is a miss. sqlite handles several processes sharing the file; a lock makes one
:class:`ResponseCache` object safe to share between threads.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any


def default_cache_path() -> Path:
    """``$EFFRAG_CACHE_DIR/llm_cache.sqlite``, else ``~/.cache/effrag/llm_cache.sqlite`` (:mod:`effrag.paths`)."""
    from effrag.paths import llm_cache_file

    return llm_cache_file()


def cache_key(payload: dict[str, Any]) -> str:
    """Stable key of a request description (canonical JSON, sorted keys)."""
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """sqlite-backed map from request key to a JSON value (the list of completions)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_cache_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(self.path), timeout=30.0, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses ("
                " key TEXT PRIMARY KEY, request TEXT NOT NULL, value TEXT NOT NULL, created REAL NOT NULL)"
            )
            self._db.commit()
        except sqlite3.DatabaseError as e:
            raise RuntimeError(f"LLM cache {self.path} is not a usable sqlite file: {e}") from e
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Any | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM responses WHERE key = ?", (key,)).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, request: dict[str, Any], value: Any) -> None:
        req = json.dumps(request, sort_keys=True, ensure_ascii=False)
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (key, request, value, created) VALUES (?, ?, ?, ?)",
                (key, req, json.dumps(value, ensure_ascii=False), time.time()),
            )
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.path)!r}, hits={self.hits}, misses={self.misses})"
