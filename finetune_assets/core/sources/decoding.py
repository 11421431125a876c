"""A file's bytes to text: streamed decompression (fsspec infers the codec from the suffix),
disguised files refused, and an incremental decoder whose errors name the exact line.
"""

from __future__ import annotations

import codecs
import lzma
from collections.abc import Iterator

import fsspec
import fsspec.compression
import pyarrow as pa

from finetune_assets.core.sources.base import (
    BLOCK_BYTES,
    HEAD_BYTES,
    MAX_RECORD_BLOCKS,
    SourceError,
)
from finetune_assets.core.sources.binary import FIX as BINARY_FIX
from finetune_assets.core.sources.binary import what_binary
from finetune_assets.core.sources.listing import split_suffix


def read_bytes(path: str) -> bytes:
    """A file's bytes, decompressed by its suffix (.gz / .bz2 / .xz / .zst)."""
    return b"".join(chunk for chunk, _ in file_blocks(path, BLOCK_BYTES))


def open_failed(path: str, compression: str | None, err: Exception) -> SourceError:
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return SourceError(f"{path}: cannot open: {err.strerror or err}")
    return SourceError(
        f"{path}: cannot decompress as {compression}: {err} (a truncated or mislabelled "
        "download? check the file, or rename it to its real type)"
    )


def _zstd_reader(infile, mode: str = "rb"):
    """fsspec reads ``.zst`` only with the ``zstandard`` package; pyarrow's codec streams it
    without one.
    """
    if "r" not in mode:
        raise ValueError("zstd: this codec only reads")
    return pa.CompressedInputStream(pa.PythonFile(infile, mode="r"), "zstd")


if "zstd" not in fsspec.available_compressions():
    fsspec.compression.register_compression("zstd", _zstd_reader, "zst")


# (byte-order mark, the encoded line feed, the code unit): UTF-32 before UTF-16, whose LE mark
# begins UTF-32 LE's.
BOMS = (
    (codecs.BOM_UTF8, "utf-8", b"\n", 1),
    (codecs.BOM_UTF32_LE, "utf-32-le", b"\n\x00\x00\x00", 4),
    (codecs.BOM_UTF32_BE, "utf-32-be", b"\x00\x00\x00\n", 4),
    (codecs.BOM_UTF16_LE, "utf-16-le", b"\n\x00", 2),
    (codecs.BOM_UTF16_BE, "utf-16-be", b"\x00\n", 2),
)
NEWLINES = {
    "utf-16": (b"\n\x00", 2),
    "utf-16-le": (b"\n\x00", 2),
    "utf-16-be": (b"\x00\n", 2),
    "utf-32": (b"\n\x00\x00\x00", 4),
    "utf-32-le": (b"\n\x00\x00\x00", 4),
    "utf-32-be": (b"\x00\x00\x00\n", 4),
}


def sample_cut(data: bytes, max_bytes: int, encoding: str | None) -> bytes:
    """The first ``max_bytes`` cut after the last whole encoded line feed (a UTF-16 / UTF-32 one
    at a code-unit boundary, found by the byte-order mark or ``encoding``), so a sample decodes.
    """
    newline, unit = next(
        ((nl, u) for bom, _, nl, u in BOMS if data.startswith(bom)),
        NEWLINES.get((encoding or "").replace("_", "-").lower(), (b"\n", 1)),
    )
    end = max_bytes
    while True:
        at = data.rfind(newline, 0, end)
        if at <= 0:
            return data[: max_bytes - max_bytes % unit]
        if at % unit == 0:
            return data[: at + len(newline)]
        end = at + len(newline) - 1


def file_blocks(
    path: str, block_bytes: int, max_bytes: int | None = None, encoding: str | None = None
) -> Iterator[tuple[bytes, bool]]:
    """A file's decompressed bytes as (block, last) pairs of ``block_bytes``.

    The first block holds at least :data:`HEAD_BYTES` and is not all whitespace unless the file is
    (the empty-file, disguised-file and UTF-16 checks look at it). ``max_bytes``: one block, the
    prefix cut after its last full line (a sample).
    """
    _, compression = split_suffix(path)
    try:
        with fsspec.open(path, "rb", compression="infer") as f:
            if max_bytes is not None:
                data = f.read(max_bytes + 1)
                if len(data) > max_bytes:
                    data = sample_cut(data, max_bytes, encoding)
                yield data, True
                return
            block = f.read(max(block_bytes, HEAD_BYTES))
            while block and not block.strip() and len(block) < MAX_RECORD_BLOCKS * block_bytes:
                more = f.read(block_bytes)
                if not more:
                    break
                block += more
            while True:
                following = f.read(block_bytes)
                yield block, not following
                if not following:
                    return
                block = following
    except (OSError, EOFError, lzma.LZMAError, pa.ArrowException) as err:
        raise open_failed(path, compression, err) from err


MAGIC = {
    b"\x1f\x8b": ("gzip-compressed", ".gz"),
    b"BZh": ("bzip2-compressed", ".bz2"),
    b"\xfd7zXZ\x00": ("xz-compressed", ".xz"),
    b"\x28\xb5\x2f\xfd": ("zstd-compressed", ".zst"),
    b"PK\x03\x04": ("a zip archive (or an Excel .xlsx workbook)", None),
    b"PAR1": ("a Parquet file", None),
}


def refuse_disguised(path: str, data: bytes, fmt: str) -> None:
    """A text format whose bytes say otherwise (a .csv that is really gzip, Excel or Parquet):
    say what it is.
    """
    if fmt == "parquet":
        return
    for magic, (what, suffix) in MAGIC.items():
        if data.startswith(magic):
            fix = (
                f"add {suffix} to its name"
                if suffix
                else "export it as CSV/TSV, or name it .parquet"
                if "Parquet" in what
                else "unpack or export it as CSV"
            )
            raise SourceError(f"{path}: the file is {what}, not {fmt} text; {fix}")
    # an image, a document, an old Office file: say so, not "encoding"
    what = what_binary(data[:4096])
    if what is not None:
        raise SourceError(f"{path}: this is {what}, not {fmt} text; {BINARY_FIX}")


def decode(path: str, data: bytes, encoding: str) -> str:
    """Bytes to text: a byte-order mark wins over ``encoding``; an error names the line and a
    likely encoding.
    """
    return Decoder(path, encoding)(data, final=True)


class Decoder:
    """A file's bytes to text block by block, as :func:`decode` on the whole file would give.

    The byte-order mark and the UTF-16-without-BOM check are decided on the first block (at least
    :data:`HEAD_BYTES`); an incremental decoder keeps a character split across blocks whole; a
    decode error names its line and offset in the whole file.
    """

    def __init__(self, path: str, encoding: str):
        self.path, self.encoding = path, encoding
        self.decoder = None
        self.head = b""  # the first bytes, for the encoding guess in an error message
        self.fed = self.newlines = 0  # bytes (after the BOM) and line ends decoded so far

    def __call__(self, data: bytes, final: bool) -> str:
        if self.decoder is None:
            self._start(data)
            data = data[self.bom :]
        if len(self.head) < 200_000:
            self.head += data[: 200_000 - len(self.head)]
        pending = self.decoder.getstate()[0]
        pending = pending if isinstance(pending, bytes) else b""
        try:
            text = self.decoder.decode(data, final)
        except UnicodeDecodeError as err:
            blob = pending + data
            line = self.newlines - pending.count(b"\n") + blob.count(b"\n", 0, err.start) + 1
            guess = _guess_encoding(self.head)
            raise SourceError(
                f"{self.path}: line {line}: not valid {self.encoding} (byte "
                f"{blob[err.start : err.start + 1].hex()} "
                f"at offset {self.fed - len(pending) + err.start}); set the source encoding, "
                f"e.g. encoding='{guess}' "
                f"(CLI --encoding {guess}, raw_reviews config `encoding`)"
            ) from err
        self.fed += len(data)
        self.newlines += data.count(b"\n")
        return text

    def _start(self, first: bytes) -> None:
        """The encoding (a byte-order mark wins), refusing UTF-16 read as UTF-8 (every other byte
        NUL).
        """
        self.bom = 0
        for bom, enc, _, _ in BOMS:
            if first.startswith(bom):
                self.bom, self.encoding = len(bom), enc
                break
        head = first[self.bom : self.bom + 4000]
        if (
            self.encoding.replace("_", "-").lower() in ("utf-8", "utf8")
            and head.count(b"\x00") > len(head) // 4
        ):
            line = head.count(b"\n", 0, head.index(b"\x00")) + 1
            raise SourceError(
                f"{self.path}: line {line}: not valid utf-8 text (every other byte is NUL: UTF-16 "
                "without a byte-order mark); set the source encoding, e.g. encoding='utf-16' (CLI "
                "--encoding utf-16, raw_reviews config `encoding`)"
            )
        try:
            if not getattr(codecs.lookup(self.encoding), "_is_text_encoding", True):
                raise LookupError(f"{self.encoding!r} is not a text encoding")
            self.decoder = codecs.getincrementaldecoder(self.encoding)()
        except LookupError as err:  # an encoding name Python does not know
            raise SourceError(
                f"{self.path}: unknown encoding {self.encoding!r}: {err} (set a valid encoding: "
                "CLI --encoding, raw_reviews config `encoding`, e.g. cp1256, cp1252, utf-16)"
            ) from err


def _guess_encoding(data: bytes) -> str:
    """A likely encoding for the error message only (never used to read)."""
    if data[:4000].count(b"\x00") > len(data[:4000]) // 4:
        return "utf-16"
    try:
        from charset_normalizer import from_bytes  # lazy: only a guess at an encoding needs it

        best = from_bytes(data[:200_000]).best()
        if best is not None and best.encoding not in ("utf_8", "ascii"):
            return best.encoding.replace("_", "-")
    except Exception:  # a hint only
        pass
    return "cp1256"
