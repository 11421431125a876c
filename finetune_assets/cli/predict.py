"""`predict` and `evaluate`: classify text, or score a model on a labelled file."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from finetune_assets.cli.common import CliError, parse_label_mapping, print_json
from finetune_assets.cli.models import add_model_choice, load_classifier

# Project and third-party modules are imported inside the functions that use them, never
# here: `--help`, and `predict` on a local folder, load neither Dagster nor MLflow
# (cli/__init__.py).


@dataclass
class InputRow:
    """One input to classify: where it came from, its text, and why it cannot be classified (if
    so).
    """

    where: str
    text: str | None
    error: str | None = None


def _check_text(row: InputRow) -> InputRow:
    from finetune_assets.core.prep.validate import normalize_text

    if row.error is None and (row.text is None or not normalize_text(row.text)):
        row.error = (
            "empty_text: only invisible characters"
            if row.text and row.text.strip()
            else "empty_text: no text"
        )
    return row


def _refuse_binary_input(path: str, command: str) -> None:
    """An image, spreadsheet or other binary file given as input: say what it is and how to get
    text.
    """
    from finetune_assets.core.sources import COMPRESSIONS, file_format
    from finetune_assets.core.sources.binary import refuse_binary

    local = Path(path)
    if "://" in path or not local.is_file() or path.lower().endswith(tuple(COMPRESSIONS)):
        return
    if file_format(path) == "parquet":
        return
    with local.open("rb") as f:
        head = f.read(4096)
    try:
        refuse_binary(path, head, command)
    except ValueError as err:
        raise CliError(str(err)) from err


def _rows_from_file(path: Path, column: str | None, encoding: str) -> tuple[list[InputRow], int]:
    """Rows of --file, read by the same readers as dataset sources; (rows, blank lines skipped in
    TXT).
    """
    from finetune_assets.core.sources import (
        SourceError,
        SourceSpec,
        decode,
        file_format,
        read_bytes,
        read_file,
    )

    if not path.is_file():
        raise CliError(
            f"input file {path} does not exist"
            if not path.exists()
            else f"input {path} is not a file"
        )
    _refuse_binary_input(str(path), "predict")
    try:
        if file_format(str(path)) is None:  # plain text: one review per line
            text = decode(str(path), read_bytes(str(path)), encoding)
            lines = text.replace("\r\n", "\n").split("\n")
            if lines and lines[-1] == "":
                lines.pop()
            rows = [
                _check_text(InputRow(f"{path}:{i}", line))
                for i, line in enumerate(lines, 1)
                if line.strip()
            ]
            return rows, sum(1 for line in lines if not line.strip())
        table = read_file(
            str(path),
            SourceSpec(uri=str(path), text_column=column, encoding=encoding),
            require_label=False,
        )
    except SourceError as err:
        raise CliError(
            f"{err} (predict: choose the column with --text-column, the encoding with --encoding)"
        ) from err
    rows = []
    for r in table.select(
        ["text", "source_row", "source_line", "malformed", "malformed_reason"]
    ).to_pylist():
        where = (
            f"{path}:{r['source_line']}"
            if r["source_line"]
            else f"{path} row {r['source_row'] + 1}"
        )
        error = f"{r['malformed_reason']}: {r['malformed']}" if r["malformed"] else None
        rows.append(_check_text(InputRow(where, r["text"], error)))
    return rows, 0


def _escape_tsv(text: str) -> str:
    """One physical line whatever the text: backslash, tab, CR and LF escaped."""
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\r", "\\r").replace("\n", "\\n")


def cmd_predict(args) -> int:
    if args.batch_size < 1:
        raise CliError("--batch-size must be at least 1")
    rows, skipped = _input_rows(args)
    if not rows:
        raise CliError("nothing to classify: the input has no non-empty lines")
    if skipped:
        print(f"note: {skipped} blank line(s) skipped (one review per line)", file=sys.stderr)
    fmt = "jsonl" if args.json else args.format
    # a terminal gets readable columns; a pipe or file gets JSON lines, safe for any text
    if fmt == "auto":
        fmt = "tsv" if sys.stdout.isatty() else "jsonl"
    classifier = load_classifier(args)
    results = _classify(args, classifier, [r for r in rows if r.error is None])
    errors = 0
    for row in rows:
        if row.error is not None:
            errors += 1
            print(f"error: {row.where}: {row.error}", file=sys.stderr)
        print(_output_line(row, results.get(id(row)), fmt))
    if errors:
        print(
            f"error: {errors} of {len(rows)} input row(s) could not be classified (see the lines "
            "above)",
            file=sys.stderr,
        )
        return 1
    return 0


def _input_rows(args) -> tuple[list[InputRow], int]:
    """What to classify: --file, the text arguments or stdin's lines; (rows, blank lines)."""
    if args.file:
        if args.text:
            raise CliError("give text arguments or --file, not both")
        return _rows_from_file(Path(args.file), args.text_column, args.encoding)
    if args.text:
        return [_check_text(InputRow(f"argument {i}", t)) for i, t in enumerate(args.text, 1)], 0
    if not sys.stdin.isatty():
        lines = [
            line.rstrip("\r\n").lstrip("\ufeff") if i == 1 else line.rstrip("\r\n")
            for i, line in enumerate(sys.stdin, 1)
        ]
        rows = [_check_text(InputRow(f"stdin:{i}", t)) for i, t in enumerate(lines, 1) if t.strip()]
        return rows, sum(1 for t in lines if not t.strip())
    raise CliError(
        "nothing to classify: pass text as arguments, --file PATH, or pipe lines on stdin"
    )


def _classify(args, classifier, todo: list[InputRow]) -> dict[int, tuple]:
    """(label, score, scores) per row (by id), in length order; a progress bar for --file."""
    from finetune_assets.core.evaluation.batching import predict_in_length_order

    bar = None
    if args.file is not None and not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(
            total=len(todo), unit="text", desc="classifying", file=sys.stderr, dynamic_ncols=True
        )
    try:
        outputs = predict_in_length_order(
            lambda batch: classifier.predict(batch, args.max_length),
            [r.text for r in todo],
            args.batch_size,
            on_batch=bar.update if bar is not None else None,
        )
        return {id(row): out for row, out in zip(todo, outputs)}
    finally:
        if bar is not None:
            bar.close()


def _output_line(row: InputRow, result: tuple | None, fmt: str) -> str:
    """One row's line on stdout: its label and scores, or ERROR (``fmt``: jsonl or tsv)."""
    if row.error is not None:
        if fmt == "jsonl":
            return json.dumps(
                {"text": row.text, "error": row.error, "where": row.where}, ensure_ascii=False
            )
        return f"ERROR\t\t{_escape_tsv(row.text or '')}"
    label, score, scores = result
    if fmt == "jsonl":
        return json.dumps(
            {
                "text": row.text,
                "label": label,
                "score": round(score, 6),
                "scores": {k: round(v, 6) for k, v in scores.items()},
            },
            ensure_ascii=False,
        )
    return f"{label}\t{score:.4f}\t{_escape_tsv(row.text)}"


def cmd_evaluate(args) -> int:
    from finetune_assets.core.evaluation.benchmark_sets import read_labelled
    from finetune_assets.core.evaluation.evaluate import format_report, map_labels, scores
    from finetune_assets.core.sources import SourceSpec

    if args.batch_size < 1:
        raise CliError("--batch-size must be at least 1")
    mapping = parse_label_mapping(args.label_mapping)
    _refuse_binary_input(args.file, "evaluate")
    spec = SourceSpec(
        uri=args.file,
        text_column=args.text_column,
        label_column=args.label_column,
        encoding=args.encoding,
    )
    texts, raw_labels = read_labelled(spec)
    classifier = load_classifier(args)
    truth = map_labels(raw_labels, mapping, classifier.labels, where=args.file)
    predicted = classifier.predict_labels(texts, args.max_length, args.batch_size)
    result = {
        "model": classifier.source,
        "file": args.file,
        **scores(truth, predicted, classifier.labels),
    }
    if args.json:
        print_json(result)
    else:
        print(f"model     {result['model']}\nfile      {args.file}")
        print(format_report(result))
    return 0


def register(sub) -> None:
    """`predict` and `evaluate`."""
    _register_predict(sub)
    _register_evaluate(sub)


def _register_predict(sub) -> None:
    pr = sub.add_parser(
        "predict",
        help="classify text with a trained model",
        description="Classify text: prints label, score and text per input (JSON lines when "
        "piped, tab separated on a terminal).",
        epilog="examples:\n"
        "  finetune-assets predict --version sample 'a fine product'\n"
        "  finetune-assets predict --model-uri models:/review-classifier@champion --file "
        "reviews.csv\n"
        "  cat reviews.txt | finetune-assets predict --model path/to/model --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pr.add_argument("text", nargs="*", help="texts to classify (default: lines from stdin)")
    src = add_model_choice(
        pr,
        version_help="the finetuned_model of this dataset version under the storage root",
        model_help="a local Hugging Face model folder (save_pretrained output)",
    )
    src.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or the "
        "SQLite store under the storage root)",
    )
    inp = pr.add_argument_group("input")
    inp.add_argument(
        "--file",
        help="CSV/TSV/JSONL/JSON array/Parquet (optionally .gz/.bz2/.xz/.zst; column "
        "--text-column, default text/review/content/sentence), or TXT (one per line)",
    )
    inp.add_argument("--text-column", help="column or JSON key holding the text (default: text)")
    inp.add_argument("--encoding", default="utf-8", help="encoding of --file (e.g. cp1256)")
    pr.add_argument("--batch-size", type=int, default=32)
    pr.add_argument(
        "--max-length", type=int, default=512, help="truncate inputs to this many tokens"
    )
    pr.add_argument(
        "--json",
        action="store_true",
        help="JSON lines with text, label, score and all scores (same as --format jsonl)",
    )
    pr.add_argument(
        "--format",
        choices=("auto", "jsonl", "tsv"),
        default="auto",
        help="auto (default): tsv on a terminal, jsonl when piped or redirected; tsv escapes "
        "tab/newline/backslash in the text; rows that cannot be classified are errors "
        "(exit status 1)",
    )
    pr.add_argument("--no-progress", action="store_true", help="no progress bar for --file")
    pr.add_argument(
        "--baseline",
        action="store_true",
        help="with --version: use baseline_model[v] (TF-IDF + LR)",
    )
    pr.set_defaults(func=cmd_predict)


def _register_evaluate(sub) -> None:
    ev = sub.add_parser(
        "evaluate",
        help="score a model on a labelled file: accuracy, macro-F1, per-class F1, confusion matrix",
        epilog="examples:\n"
        "  finetune-assets evaluate --version sample --file labelled.csv\n"
        "  finetune-assets evaluate --version sample --baseline --file labelled.csv --json\n"
        "  finetune-assets evaluate --model-uri models:/review-classifier@champion --file "
        "test.jsonl",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    esrc = add_model_choice(
        ev,
        version_help="the finetuned_model (or with --baseline the baseline_model) of a version",
        model_help="a local Hugging Face model folder",
    )
    esrc.add_argument(
        "--baseline", action="store_true", help="with --version: score baseline_model[v]"
    )
    esrc.add_argument("--tracking-uri", help="MLflow tracking URI (default as for predict)")
    ev.add_argument("--file", required=True, help="labelled CSV/TSV/JSONL/Parquet file (or folder)")
    ev.add_argument("--text-column", help="default: text/review/content/sentence")
    ev.add_argument("--label-column", help="default: label/polarity/sentiment/rating_class")
    ev.add_argument(
        "--label-mapping", help="raw label -> model class: JSON object or RAW=Class,RAW=Class"
    )
    ev.add_argument("--encoding", default="utf-8")
    ev.add_argument("--batch-size", type=int, default=32)
    ev.add_argument("--max-length", type=int, default=512)
    ev.add_argument("--json", action="store_true", help="one JSON object")
    ev.set_defaults(func=cmd_evaluate)
