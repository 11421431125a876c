"""The duplicate index of a streamed validation: every accepted review's text hash, on disk."""

from __future__ import annotations

import sqlite3
import tempfile


class SeenTexts:
    """Normalized-text hash -> (class, file, "line N") of its first accepted copy, on disk (SQLite,
    temp file).

    Anonymous memory stays flat whatever the version's size (about 70 bytes a review on disk):
    SQLite's own page cache, which is the process's memory, is capped at ``cache_mb``, and the file
    is read memory-mapped (``mmap_bytes``), so the pages a lookup touches are the OS page cache:
    shared with the file, reclaimed by the kernel under pressure, not the process's anonymous
    memory. (A 16 MB private cache filled at ~0.25M reviews and made 5M rows peak 1.23x higher than
    0.1M.) The file is a temporary one (``TMPDIR``), removed on ``close``; keep ``TMPDIR`` on disk,
    not on a RAM-backed volume.
    """

    def __init__(self, cache_mb: int = 2, mmap_bytes: int = 1 << 40):
        self._dir = tempfile.TemporaryDirectory(prefix="seen-texts-")
        self._db = sqlite3.connect(f"{self._dir.name}/seen.db")
        # mmap_size is clamped to the library's SQLITE_MAX_MMAP_SIZE (2 GiB in common builds, ~30M
        # reviews); beyond it SQLite reads the rest of the file with read(), still through the page
        # cache.
        self._db.executescript(
            "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA "
            f"cache_size=-{cache_mb * 1024};"
            f"PRAGMA mmap_size={mmap_bytes};"
            "CREATE TABLE seen (h BLOB PRIMARY KEY, label TEXT, file TEXT, loc TEXT, pos "
            "INTEGER) WITHOUT ROWID;"
            # every copy of a review that has more than one (decided by data.conflicts at the end)
            "CREATE TABLE copies (h BLOB, label TEXT, pos INTEGER, kind TEXT, PRIMARY KEY (kind, "
            "pos));"
        )

    def lookup(self, keys: list[bytes]) -> dict[bytes, tuple[str, str, str, int]]:
        found: dict[bytes, tuple[str, str, str, int]] = {}
        unique = list(dict.fromkeys(keys))
        for i in range(0, len(unique), 900):
            chunk = unique[i : i + 900]
            rows = self._db.execute(
                "SELECT h, label, file, loc, pos FROM seen WHERE h IN "
                f"({','.join('?' * len(chunk))})",
                chunk,
            )
            found.update((h, (label, file, loc, pos)) for h, label, file, loc, pos in rows)
        return found

    def add(
        self, entries: dict[bytes, tuple[str, str, str, int]], copies: list[tuple] = ()
    ) -> None:
        self._db.executemany(
            "INSERT INTO seen VALUES (?, ?, ?, ?, ?)", ((h, *v) for h, v in sorted(entries.items()))
        )
        self._db.executemany("INSERT OR IGNORE INTO copies VALUES (?, ?, ?, ?)", copies)
        self._db.commit()

    def conflicting_copies(self) -> list[tuple[bytes, str, int, str]]:
        """Every copy of the reviews whose copies carry more than one class."""
        return self._db.execute(
            "SELECT h, label, pos, kind FROM copies WHERE h IN "
            "(SELECT h FROM copies GROUP BY h HAVING COUNT(DISTINCT label) > 1) ORDER BY h, "
            "kind, pos"
        ).fetchall()

    def close(self) -> None:
        self._db.close()
        self._dir.cleanup()
