"""Recognise files that are not text at all (images, documents, spreadsheets, archives) by their
first bytes, so that a reader says what the file is and how to get text out of it, instead of
suggesting encodings.
"""

from __future__ import annotations

# magic bytes -> what the file is (https://en.wikipedia.org/wiki/List_of_file_signatures)
SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"RIFF", "a RIFF file (WebP image, WAV audio or AVI video)"),
    (b"%PDF-", "a PDF document"),
    (b"PK\x03\x04", "a zip archive (an Excel .xlsx / Word .docx document is one)"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old Office document (Excel .xls / Word .doc)"),
    (b"PAR1", "a Parquet file"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"\x1f\x8b", "gzip-compressed data"),
    (b"\x7fELF", "an executable"),
)
FIX = (
    "export the reviews from it as CSV UTF-8 (a spreadsheet: File > Save As > CSV UTF-8), or "
    "pass a "
    "CSV/TSV/JSONL/JSON/Parquet file or plain text with one review per line"
)


def what_binary(head: bytes) -> str | None:
    """What a file starting with ``head`` is when it is not text, else None.

    A byte-order mark means text; NUL bytes in every other position are UTF-16 text (left to the
    decoder's message); NUL bytes otherwise, or many control bytes, are binary data of an unknown
    kind.
    """
    for magic, what in SIGNATURES:
        if head.startswith(magic):
            return what
    if head.startswith((b"\xff\xfe", b"\xfe\xff", b"\xef\xbb\xbf")):  # a byte-order mark: text
        return None
    sample = head[:4096]
    nul = sample.count(b"\x00")
    if nul:
        one_parity = max(sample[0::2].count(b"\x00"), sample[1::2].count(b"\x00"))
        # UTF-16 without a BOM: the decoder says
        utf16 = nul > len(sample) // 4 and one_parity >= 0.9 * nul
        return None if utf16 or _text_with_stray_nuls(sample, nul) else "binary data"
    control = sum(1 for b in sample if b < 9 or 13 < b < 27 or 27 < b < 32)
    return "binary data" if sample and control > len(sample) // 10 else None


def _text_with_stray_nuls(sample: bytes, nul: int) -> bool:
    """A few NUL bytes (some database exports write them) in what is otherwise valid UTF-8 text
    with few control bytes: text, whose lines holding a NUL the readers quarantine.
    """
    if nul > max(1, len(sample) // 100):
        return False
    cut = sample.rfind(b"\n")
    body = (sample[: cut + 1] if cut > 0 else sample).replace(b"\x00", b"")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    control = sum(1 for b in body if b < 9 or 13 < b < 27 or 27 < b < 32)
    return control <= len(body) // 100


def refuse_binary(path: str, head: bytes, command: str) -> None:
    """Raise ValueError naming the file, what it is and the fix, when ``head`` is not text."""
    what = what_binary(head)
    if what is not None:
        raise ValueError(f"{path}: this is {what}, not text that {command} can read; {FIX}")
