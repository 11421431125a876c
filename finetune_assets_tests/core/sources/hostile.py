"""A generator of hostile review files, with the expected outcome of every record computed by the
generator.

It fakes what careless exporters write: spreadsheets (BOM, CRLF or classic-Mac CR line ends, UTF-16
"Unicode text" TSV, stray and undoubled quotes, cells pasted with tabs/newlines), database dumps
(``\\N`` / ``NULL`` cells, unquoted TSV, a second header from ``cat a.csv b.csv``), and scrapers
(unquoted commas, zero-width and bidi control characters, megabyte reviews, cut downloads). Good
records are written with Python's ``csv.writer`` (correct quoting); bad ones are written by hand.

What it does not fake: encodings beyond UTF-8/UTF-16, or defects whose "right" reading is a
matter of taste (e.g. a quote inside an unquoted TSV field is quarantined, never guessed).

Expectations are independent of the reader under test: every review carries a unique token
(``R00042``), and each physical record is tagged with the reason the generator intends
(None = accepted). The tests then check rows in = accepted + rejected = generated records, the
reasons per count, and that every accepted review holds exactly one token (no merged reviews).
"""

from __future__ import annotations

import csv
import io
import random
import re
from dataclasses import dataclass, field

TOKEN = re.compile(r"R\d{5}")
WORDS = (
    "great",
    "bad",
    "okay",
    "ممتاز",
    "سيء",
    "الخدمة",
    "رائع",
    "hotel",
    "food",
    "price",
    "stars",
    "room",
)
LABELS = ("1", "-1", "0")
INVISIBLE = (
    "\u200b",
    "\u200c",
    "\u200d",
    "\u200e",
    "\u200f",
    "\u202a",
    "\u202b",
    "\u202c",
    "\u202e",
    "\u2066",
    "\u2069",
    "\u2060",
    "\ufeff",
    "\u00ad",
    "\u061c",
)


@dataclass
class Generated:
    """A file body and, per physical record, what must happen to it."""

    name: str
    body: bytes
    delimiter: str
    # (token, reason or None)
    expected: list[tuple[str | None, str | None]] = field(default_factory=list)
    encoding: str = "utf-8"

    @property
    def rows(self) -> int:
        return len(self.expected)

    @property
    def reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, reason in self.expected:
            if reason is not None:
                out[reason] = out.get(reason, 0) + 1
        return out

    @property
    def accepted_tokens(self) -> set[str]:
        return {t for t, reason in self.expected if reason is None}


class Writer:
    """Builds one file record by record, tagging each with its expected outcome."""

    def __init__(self, rng: random.Random, delimiter: str = ",", newline: str = "\n"):
        self.rng, self.delimiter, self.newline = rng, delimiter, newline
        self.parts: list[str] = []
        self.expected: list[tuple[str | None, str | None]] = []
        self.n = 0

    def text(
        self, multiline: bool = False, quotes: bool = False, delimiters: bool = True
    ) -> tuple[str, str]:
        """A unique review (its token first) with commas, tabs, quotes or newlines that force
        quoting.
        """
        token = f"R{self.n:05d}"
        self.n += 1
        words = [self.rng.choice(WORDS) for _ in range(self.rng.randint(2, 9))]
        if delimiters:
            words.insert(self.rng.randint(0, len(words)), self.delimiter)
        if quotes:
            words.insert(self.rng.randint(0, len(words)), '"quoted"')
        if multiline:
            words.insert(self.rng.randint(0, len(words)), "\n")
        return token, f"{token} " + " ".join(words)

    def record(self, fields: list[str]) -> str:
        buf = io.StringIO()
        csv.writer(buf, delimiter=self.delimiter, lineterminator=self.newline).writerow(fields)
        return buf.getvalue()

    def header(self, names=("text", "polarity")) -> None:
        self.parts.append(self.record(list(names)))

    def good(self, **kw) -> tuple[str, str]:
        token, text = self.text(**kw)
        label = self.rng.choice(LABELS)
        self.parts.append(self.record([text, label]))
        self.expected.append((token, None))
        return text, label

    def raw(self, line: str, reason: str | None, token: str | None = None) -> None:
        """A hand-written record (no newline inside): ``reason`` is what must happen to it."""
        self.parts.append(line + self.newline)
        self.expected.append((token, reason))

    def body(self) -> str:
        return "".join(self.parts)


def _mix(w: Writer, n: int) -> None:
    for _ in range(n):
        w.good(multiline=w.rng.random() < 0.2, quotes=w.rng.random() < 0.2)


def stray_quote(rng: random.Random) -> Generated:
    """The issue's case: one unclosed quote in the middle of a file of quoted and unquoted
    reviews.
    """
    w = Writer(rng)
    w.header()
    _mix(w, 60)
    w.raw('"Best hotel ever, 5 stars,1', "malformed_row")
    _mix(w, 60)
    return Generated("stray_quote.csv", w.body().encode(), ",", w.expected)


def stray_quote_no_more_quotes(rng: random.Random) -> Generated:
    """A stray quote with no quote after it: every later line would otherwise collapse into one
    field.
    """
    w = Writer(rng)
    w.header()
    for _ in range(40):
        w.good(delimiters=False)
    w.raw('"an unclosed review start,1', "malformed_row")
    for _ in range(500):
        w.good(delimiters=False)
    return Generated("stray_end.csv", w.body().encode(), ",", w.expected)


def excel_export(rng: random.Random) -> Generated:
    """Excel "CSV UTF-8": BOM, CRLF, multi-line cells, an undoubled quote and text after a
    closing quote.
    """
    w = Writer(rng, newline="\r\n")
    w.header()
    _mix(w, 40)
    w.raw('"he said "wow" twice",1', "malformed_row")
    _mix(w, 20)
    w.raw('"closed" and more,1', "malformed_row")
    _mix(w, 20)
    return Generated("excel.csv", b"\xef\xbb\xbf" + w.body().encode(), ",", w.expected)


def mac_cr_export(rng: random.Random) -> Generated:
    """Old Mac spreadsheet export: lines end with a bare CR."""
    w = Writer(rng, newline="\r")
    w.header()
    for _ in range(50):
        w.good(quotes=rng.random() < 0.3)
    return Generated("mac.csv", w.body().encode(), ",", w.expected)


def scraper_rows(rng: random.Random) -> Generated:
    """Scraped reviews: unquoted commas (too many fields), a missing label, invisible-only and
    RLM-prefixed copies, null markers, a megabyte review, blank lines.
    """
    w = Writer(rng)
    w.header()
    _mix(w, 30)
    token, text = w.text(delimiters=False)
    w.raw(f"{text}, cheap, fast,1", "malformed_row", token)  # 4 fields for 2 columns
    token, text = w.text(delimiters=False)
    w.raw(text, "malformed_row", token)  # 1 field
    first, label = w.good(delimiters=False)
    # the same review behind a right-to-left mark and with a zero-width space inside is a duplicate
    w.raw(w.record(["\u200f" + first.replace(" ", " \u200b", 1), label]).rstrip("\n"), "duplicate")
    w.raw(
        w.record(["".join(rng.choice(INVISIBLE) for _ in range(6)), "1"]).rstrip("\n"), "empty_text"
    )
    for marker in ("NULL", "\\N", "NaN", "   "):
        w.raw(w.record([marker, "1"]).rstrip("\n"), "empty_text")
    w.parts.append("\n\n")  # blank lines: not records
    token, _ = w.text()
    w.raw(w.record([token + " " + "x" * 1_100_000, "1"]).rstrip("\n"), "too_long", token)
    token, text = w.text()
    w.raw(w.record([text, "5 stars"]).rstrip("\n"), "unknown_label", token)
    _mix(w, 30)
    return Generated("scraped.csv", w.body().encode(), ",", w.expected)


def concatenated_exports(rng: random.Random) -> Generated:
    """``cat a.csv b.csv``: the second header is a ``header_row``, never a review in a class
    "polarity".
    """
    w = Writer(rng)
    w.header()
    _mix(w, 30)
    w.raw("text,polarity", "header_row")
    _mix(w, 30)
    return Generated("concat.csv", w.body().encode(), ",", w.expected)


def tsv_unclosed_quote(rng: random.Random) -> Generated:
    """The issue's TSV case: a field starting with an unclosed quote must not merge the next
    reviews.
    """
    w = Writer(rng, delimiter="\t")
    w.header()
    for _ in range(30):
        w.good(delimiters=False, quotes=rng.random() < 0.3)
    token, text = w.text(delimiters=False)
    w.raw(f'"{text}\t1', "malformed_row", token)
    for _ in range(30):
        w.good(delimiters=False, quotes=rng.random() < 0.3)
    return Generated("unclosed.tsv", w.body().encode(), "\t", w.expected)


def db_dump_tsv(rng: random.Random) -> Generated:
    """A database dump as TSV: ``\\N`` nulls, a bare quote inside an unquoted cell (quarantined,
    not guessed).
    """
    w = Writer(rng, delimiter="\t")
    w.header(("id", "review", "sentiment"))
    for i in range(40):
        token, text = w.text(delimiters=False)
        w.raw(f"{i}\t{text}\t{rng.choice(LABELS)}", None, token)
    w.raw("40\t\\N\t1", "empty_text")
    token, text = w.text(delimiters=False)
    w.raw(f'41\t{text} 5" screen\t1', "malformed_row", token)
    return Generated("dump.tsv", w.body().encode(), "\t", w.expected)


def utf16_unicode_text(rng: random.Random) -> Generated:
    """Excel "Unicode Text": UTF-16 LE with a BOM, tab-separated, CRLF."""
    w = Writer(rng, delimiter="\t", newline="\r\n")
    w.header()
    _mix(w, 40)
    return Generated("unicode.tsv", b"\xff\xfe" + w.body().encode("utf-16-le"), "\t", w.expected)


def cut_download(rng: random.Random) -> Generated:
    """A download cut inside a multi-line quoted review: each line of the stub is quarantined on
    its own.
    """
    w = Writer(rng)
    w.header()
    _mix(w, 30)
    token, text = w.text(delimiters=False)
    w.parts.append(f'"{text}\nsecond line of it\nthird')
    w.expected += [(token, "malformed_row"), (None, "malformed_row"), (None, "malformed_row")]
    return Generated("cut.csv", w.body().encode(), ",", w.expected)


def undoubled_quote_multiline(rng: random.Random) -> Generated:
    """A hand-edited multi-line cell with an undoubled quote: its tail (``more text",1``) must
    not become a review.
    """
    w = Writer(rng)
    w.header()
    _mix(w, 20)
    token, text = w.text(delimiters=False)
    w.parts.append(f'"{text} he said "wow" and\nmore of it",1\n')
    w.expected += [(token, "malformed_row"), (None, "malformed_row")]
    _mix(w, 20)
    return Generated("undoubled.csv", w.body().encode(), ",", w.expected)


def repeated_headers(rng: random.Random) -> Generated:
    """Several exports pasted together: headers repeated anywhere, one behind a BOM, one
    upper-cased, one quoted, with CRLF line ends (each ``header_row``).
    """
    w = Writer(rng, newline="\r\n")
    w.header()
    repeats = ["text,polarity", "\ufefftext,polarity", "TEXT,Polarity", '"text","polarity"']
    for line in rng.sample(repeats, len(repeats)):
        _mix(w, rng.randint(3, 12))
        w.raw(line, "header_row")
    _mix(w, 5)
    return Generated("headers.csv", w.body().encode(), ",", w.expected)


SPELLINGS = {
    "Positive": ("pos", "POS", "Positive", "positive.", " positive ", "+ve"),
    "Negative": ("neg", "NEG", "Negative", "«negative»", "-ve", "negative!"),
    "Mixed": ("mixed", "MIXED", "neutral", "Neu"),
}
MISSING_MARKERS = ("N/A", "NA", "NaN", "null", "NULL", "None", "-", "?", "", "#N/A", "<NA>", "\\N")


def label_spellings(rng: random.Random) -> Generated:
    """A label column mixing abbreviations, full words, case, punctuation and missing-value markers:
    every spelling lands in its class (accepted), every marker is ``missing_label``.
    """
    w = Writer(rng)
    w.header()
    for _ in range(60):
        token, text = w.text(delimiters=False)
        if rng.random() < 0.25:
            w.raw(
                w.record([text, rng.choice(MISSING_MARKERS)]).rstrip("\n"), "missing_label", token
            )
        else:
            spelling = rng.choice(SPELLINGS[rng.choice(list(SPELLINGS))])
            w.raw(w.record([text, spelling]).rstrip("\n"), None, token)
    return Generated("spellings.csv", w.body().encode(), ",", w.expected)


def mixed_line_endings(rng: random.Random) -> Generated:
    """Line ends mixed in one file: a CRLF file where a review's inner line break is a bare LF
    (unquoted) and an LF file where it is a CRLF; both lines are ``ambiguous_line_end``, never two
    reviews. A bare CR inside a line stays text.
    """
    out_body, expected, n = "", [], 0
    for newline, odd in (("\r\n", "\n"), ("\n", "\r\n")):
        w = Writer(rng, newline=newline)
        w.n = n  # tokens stay unique across the two parts
        if not out_body:
            w.header()
        for _ in range(rng.randint(2, 4)):
            _mix(w, rng.randint(3, 10))
            token, text = w.text(delimiters=False)
            w.raw(f"{text} first line{odd}second line of it,1", "ambiguous_line_end", token)
            w.expected.append((None, "ambiguous_line_end"))
        token, text = w.text(delimiters=False)
        w.raw(f"{text} with a bare\rCR inside,1", None, token)
        _mix(w, 3)
        out_body, expected, n = out_body + w.body(), expected + w.expected, w.n
    return Generated("line_ends.csv", out_body.encode(), ",", expected)


def jsonl_text_key_changes(rng: random.Random) -> Generated:
    """A scraper's JSON Lines whose text key changes half-way (``review`` -> ``body`` / ``Review
    Text``): each record's own text key is its text (no record holds two); a record with no text
    key at all (``comment_txt``) is ``missing_text_field`` (raw line kept).
    """
    import json

    w = Writer(rng)
    lines = []
    for _ in range(rng.randint(20, 40)):
        token, text = w.text(delimiters=False)
        lines.append(
            json.dumps({"review": text, "sentiment": rng.choice(LABELS)}, ensure_ascii=False)
        )
        w.expected.append((token, None))
    for _ in range(rng.randint(5, 15)):
        token, text = w.text(delimiters=False)
        key = rng.choice(("body", "Review Text", "comment_txt"))
        if key == "comment_txt":
            lines.append(json.dumps({key: text, "sentiment": "1"}, ensure_ascii=False))
            w.expected.append((token, "missing_text_field"))
        else:
            lines.append(
                json.dumps({key: text, "sentiment": rng.choice(LABELS)}, ensure_ascii=False)
            )
            w.expected.append((token, None))
    # the key with no value: empty text
    lines.append(json.dumps({"review": None, "sentiment": "1"}))
    w.expected.append((None, "empty_text"))
    return Generated("scraped.jsonl", ("\n".join(lines) + "\n").encode(), "", w.expected)


def conflicting_copies(rng: random.Random) -> Generated:
    """Copies of one review with different labels: 3+ copies with a majority label keep one copy of
    it (the first copy read may be the outvoted one); no majority (2 copies, or 2:2) quarantines
    every copy as ``conflicting_duplicate``.
    """
    w = Writer(rng)
    w.header()
    _mix(w, 10)
    for _ in range(rng.randint(3, 6)):
        token, text = w.text(delimiters=False)
        kind = rng.choice(("majority_first", "majority_later", "pair", "tie"))
        if kind.startswith("majority"):
            labels = ["-1", "1", "1"] if kind == "majority_later" else ["1", "-1", "1"]
            reasons = (
                {0: "conflicting_duplicate", 1: None, 2: "duplicate"}
                if kind == "majority_later"
                else {0: None, 1: "conflicting_duplicate", 2: "duplicate"}
            )
        else:
            labels = ["1", "-1"] if kind == "pair" else ["1", "-1", "-1", "1"]
            reasons = dict.fromkeys(range(len(labels)), "conflicting_duplicate")
        for i, label in enumerate(labels):
            w.raw(w.record([text, label]).rstrip("\n"), reasons[i], token)
        _mix(w, rng.randint(1, 5))
    return Generated("conflicts.csv", w.body().encode(), ",", w.expected)


GENERATORS = {
    f.__name__: f
    for f in (
        stray_quote,
        stray_quote_no_more_quotes,
        excel_export,
        mac_cr_export,
        scraper_rows,
        concatenated_exports,
        tsv_unclosed_quote,
        db_dump_tsv,
        utf16_unicode_text,
        cut_download,
        undoubled_quote_multiline,
        repeated_headers,
        label_spellings,
        mixed_line_endings,
        jsonl_text_key_changes,
        conflicting_copies,
    )
}
