"""CSV/TSV reading strategies compared on correctness (hostile files) and speed (the real review
files).

    .venv/bin/python benchmarks/csv_readers.py [--repeats 5] [--out
    benchmarks/results/csv_readers.json]

Strategies, each returning (good rows, bad records) for one file:

- ``pyarrow``: ``pyarrow.csv.read_csv`` with ``newlines_in_values`` and an ``invalid_row_handler``
  that counts bad rows (the reader this project used before issue 12);
- ``python_csv``: ``csv.reader`` (lenient, the stdlib default), rows with the wrong field count are
  bad;
- ``python_csv_strict``: ``csv.reader(strict=True)`` re-started on the next line after each error
  (a two-pass flavour: the error position is only known after the fact);
- ``project``: ``finetune_assets.core.sources.delimited.split_records`` (strict grammar, resync on
the next
  line).

Correctness: on every generator of ``finetune_assets_tests/core/sources/hostile.py`` (3 seeds),
are the
numbers of records and of bad records equal to the generator's own counts, and does no good row hold
two reviews' tokens? Speed: best of ``--repeats`` over the three real files (decode + split, no
validation).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = REPO.parent / "shared" / "data" / "arabic_reviews"
if not DATA.exists():
    DATA = Path("/work/shared/data/arabic_reviews")


def _text(data: bytes) -> str:
    for bom, enc in ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le")):
        if data.startswith(bom):
            return data[len(bom) :].decode(enc)
    return data.decode("utf-8")


def read_pyarrow(data: bytes, delimiter: str) -> tuple[list[list[str]], int]:
    import pyarrow.csv as pacsv

    bad = []
    text = _text(data)
    table = pacsv.read_csv(
        io.BytesIO(text.encode()),
        read_options=pacsv.ReadOptions(block_size=64 << 20),
        parse_options=pacsv.ParseOptions(
            delimiter=delimiter,
            newlines_in_values=True,
            invalid_row_handler=lambda r: bad.append(r) or "skip",
        ),
    )
    import pyarrow as pa

    table = table.cast(pa.schema([(n, pa.string()) for n in table.column_names]))
    return [list(r.values()) for r in table.to_pylist()], len(bad)


def read_python_csv(data: bytes, delimiter: str) -> tuple[list[list[str]], int]:
    rows = [r for r in csv.reader(io.StringIO(_text(data), newline=""), delimiter=delimiter) if r]
    n = len(rows[0])
    return [r for r in rows[1:] if len(r) == n], sum(1 for r in rows[1:] if len(r) != n)


def read_python_csv_strict(data: bytes, delimiter: str) -> tuple[list[list[str]], int]:
    lines = _text(data).splitlines(keepends=True)
    good, bad, start, n = [], 0, 0, None
    while start < len(lines):
        reader = csv.reader(iter(lines[start:]), delimiter=delimiter, strict=True)
        consumed = 0
        try:
            for row in reader:
                consumed = reader.line_num
                if not row:
                    continue
                if n is None:
                    n = len(row)
                elif len(row) == n:
                    good.append(row)
                else:
                    bad += 1
            start = len(lines)
        except csv.Error:
            bad += 1
            start += consumed + 1  # give up the first line of the broken record, resume on the next
    return good, bad


def read_project(data: bytes, delimiter: str) -> tuple[list[list[str]], int]:
    from finetune_assets.core.sources.delimited import split_records

    recs = split_records(_text(data), delimiter)
    return [list(r) for r in zip(*recs.columns)], len(recs.bad)


STRATEGIES = {
    "pyarrow": read_pyarrow,
    "python_csv": read_python_csv,
    "python_csv_strict": read_python_csv_strict,
    "project": read_project,
}


def correctness() -> dict:
    sys.path.insert(0, str(REPO))
    from finetune_assets_tests.core.sources.hostile import GENERATORS, TOKEN

    out = {}
    for name, reader in STRATEGIES.items():
        ok, cases, problems = 0, 0, []
        for gen_name, make in GENERATORS.items():
            for seed in range(3):
                gen = make(random.Random(seed))
                cases += 1
                try:
                    good, bad = reader(gen.body, gen.delimiter)
                except Exception as err:  # noqa: BLE001 - a strategy that fails the whole file
                    problems.append(f"{gen_name}[{seed}]: {type(err).__name__}: {str(err)[:80]}")
                    continue
                merged = sum(1 for r in good if len(TOKEN.findall(" ".join(r))) > 1)
                want_bad = gen.reasons.get("malformed_row", 0)
                if len(good) + bad == gen.rows and bad == want_bad and not merged:
                    ok += 1
                else:
                    problems.append(
                        f"{gen_name}[{seed}]: {len(good) + bad} records (expected {gen.rows}), "
                        f"{bad} bad "
                        f"(expected {want_bad}), {merged} rows holding several reviews"
                    )
        out[name] = {"cases_exact": ok, "cases": cases, "problems": problems[:6]}
    return out


def speed(repeats: int) -> dict:
    files = [(p, p.read_bytes()) for p in sorted(DATA.glob("*.csv"))]
    out = {}
    for name, reader in STRATEGIES.items():
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            rows = sum(len(reader(data, ",")[0]) for _, data in files)
            times.append(time.perf_counter() - t0)
        out[name] = {"best_s": round(min(times), 4), "rows": rows}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "csv_readers.json"
    )
    args = parser.parse_args()
    results = {
        "benchmark": "csv_readers",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python benchmarks/csv_readers.py " + " ".join(sys.argv[1:]),
        "correctness": correctness(),
        "speed_real_files": speed(args.repeats),
    }
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
