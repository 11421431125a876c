"""The duplicate index: exact answers from a file larger than its private page cache, read
memory-mapped.
"""

import hashlib

from finetune_assets.core.prep.seen_texts import SeenTexts


def test_index_beyond_its_private_cache_answers_exactly_through_the_mapped_file():
    """40k reviews (~3 MB of index) through a 2 MB private cache: every key found with its first
    copy, unknown keys not found, conflicting copies listed. The cache stays capped (what made 5M
    rows peak higher than 0.1M) and the file is memory-mapped (page cache, not the process's
    anonymous memory).
    """
    seen = SeenTexts(cache_mb=2)
    try:
        (cache,) = seen._db.execute("PRAGMA cache_size").fetchone()
        (mapped,) = seen._db.execute("PRAGMA mmap_size").fetchone()
        assert cache == -2 * 1024
        assert mapped >= 1 << 30  # the library's cap (2 GiB in common builds) or more
        keys = [hashlib.blake2b(str(i).encode(), digest_size=16).digest() for i in range(40_000)]
        for start in range(0, len(keys), 16_384):
            batch = keys[start : start + 16_384]
            seen.add(
                {
                    k: ("Positive", "a.csv", f"line {start + i}", start + i)
                    for i, k in enumerate(batch)
                }
            )
        seen.add({}, [(keys[7], "Positive", 7, "a"), (keys[7], "Negative", 0, "r")])
        found = seen.lookup(keys[::997] + [b"\x00" * 16])
        assert len(found) == len(keys[::997])
        assert found[keys[997]] == ("Positive", "a.csv", "line 997", 997)
        assert seen.conflicting_copies() == [
            (keys[7], "Positive", 7, "a"),
            (keys[7], "Negative", 0, "r"),
        ]
    finally:
        seen.close()
