"""Scores of a classifier on labelled texts: one definition for the baseline, the CLI and benchmark sets.

Macro-F1 averages over *every* class of the label set (a class with no support and no prediction scores
0), the same rule as the trainer's torchmetrics and ``gate.macro_f1``, so numbers are comparable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from finetune_assets.data.labels import DEFAULT_LABEL_MAPPING, LABELS, LabelError, LabelSet


class LabelSetMismatch(ValueError):
    """Labels in an evaluation file that the model cannot predict."""


def order_labels(names) -> list[str]:
    """A label set in a stable order: the known classes in LABELS order, then others alphabetically."""
    names = set(names)
    return [n for n in LABELS if n in names] + sorted(n for n in names if n not in LABELS)


def scores(y_true: Sequence[str], y_pred: Sequence[str], labels: Sequence[str]) -> dict:
    """accuracy, macro_f1, f1_per_class, confusion_matrix (rows true, columns predicted, in ``labels`` order)."""
    index = {name: i for i, name in enumerate(labels)}
    unknown = sorted({y for y in [*y_true, *y_pred] if y not in index})
    if unknown:
        raise LabelSetMismatch(f"labels {unknown} are not in the label set {list(labels)}")
    t = np.fromiter((index[y] for y in y_true), dtype=np.int64, count=len(y_true))
    p = np.fromiter((index[y] for y in y_pred), dtype=np.int64, count=len(y_pred))
    k = len(labels)
    cm = np.bincount(t * k + p, minlength=k * k).reshape(k, k) if len(t) else np.zeros((k, k), dtype=np.int64)
    f1 = {}
    for i, name in enumerate(labels):
        tp, fp, fn = int(cm[i, i]), int(cm[:, i].sum() - cm[i, i]), int(cm[i, :].sum() - cm[i, i])
        f1[name] = 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)
    return {
        "samples": int(len(t)),
        "accuracy": float((t == p).mean()) if len(t) else 0.0,
        "macro_f1": float(np.mean(list(f1.values()))) if f1 else 0.0,
        "f1_per_class": f1,
        "labels": list(labels),
        "confusion_matrix": cm.tolist(),
    }


def majority_scores(train_labels: Sequence[str], y_true: Sequence[str], labels: Sequence[str]) -> dict:
    """Always answering the most frequent *training* class: the floor any model must clear."""
    values, counts = np.unique(np.asarray(list(train_labels), dtype=object), return_counts=True)
    majority = str(values[int(np.argmax(counts))]) if len(values) else labels[0]
    return {**scores(y_true, [majority] * len(y_true), labels), "majority_class": majority}


def map_labels(raw: Sequence[str | None], mapping: dict[str, str] | None, labels: Sequence[str],
               where: str) -> list[str]:
    """Raw labels of a labelled file -> the model's label names; refuses (naming them) labels it cannot predict.

    A label already in ``labels`` stays; otherwise ``mapping`` over the default one (1/-1/0 and names; exact, then lower-case, then as a number:
    ``1.0`` == ``1``) decides. Nothing is dropped: one unknown label refuses the whole file, because a
    score on a silently shrunk set is a different benchmark.
    """
    defaults = {k: v for k, v in DEFAULT_LABEL_MAPPING.items() if v in labels}  # 1/-1/0 only where they fit
    try:
        label_set = LabelSet(tuple(labels), {**defaults, **(mapping or {})})
    except LabelError as err:
        raise LabelSetMismatch(f"{where}: {err}") from err
    out, unknown = [], {}
    for value in raw:
        key = None if value is None else str(value).strip()
        name = label_set.map(key)
        if name is None or name not in labels:
            unknown[key] = unknown.get(key, 0) + 1
            continue
        out.append(name)
    if unknown:
        shown = ", ".join(f"{k!r} ({n} rows)" for k, n in sorted(unknown.items(), key=lambda kv: -kv[1])[:10])
        raise LabelSetMismatch(
            f"{where}: labels {shown} do not match the model's label set {list(labels)}; map them with "
            "--label-mapping '{\"raw\": \"Class\", ...}' (or score a model trained on these labels)")
    return out


def format_report(result: dict) -> str:
    """Accuracy, macro-F1, per-class F1 and the confusion matrix as plain text."""
    labels = result["labels"]
    width = max(8, *(len(n) for n in labels))
    lines = [f"samples   {result['samples']}", f"accuracy  {result['accuracy']:.4f}",
             f"macro-F1  {result['macro_f1']:.4f}", "", "F1 per class"]
    lines += [f"  {n:<{width}} {result['f1_per_class'][n]:.4f}" for n in labels]
    lines += ["", "confusion matrix (rows: true, columns: predicted)",
              " " * (width + 2) + " ".join(f"{n[:width]:>{width}}" for n in labels)]
    lines += [f"  {n:<{width}}" + " ".join(f"{c:>{width}}" for c in row)
              for n, row in zip(labels, result["confusion_matrix"])]
    return "\n".join(lines)
