"""Scores of a classifier on labelled texts: one definition for the baseline, the CLI and benchmark
sets.

Every macro-F1 outside the trainer comes from here (scikit-learn underneath), with the trainer's
torchmetrics rule, so the numbers are comparable (a test checks the two on the same predictions).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from finetune_assets.core.labels.infer import DEFAULT_LABEL_MAPPING, LABELS, LabelError, LabelSet


class LabelSetMismatch(ValueError):
    """Labels in an evaluation file that the model cannot predict."""


def order_labels(names) -> list[str]:
    """A label set in a stable order: the known classes in LABELS order, then others
    alphabetically.
    """
    names = set(names)
    return [n for n in LABELS if n in names] + sorted(n for n in names if n not in LABELS)


def scores(y_true: Sequence[str], y_pred: Sequence[str], labels: Sequence[str]) -> dict:
    """accuracy, macro_f1, f1_per_class, confusion_matrix (rows true, columns predicted, in
    ``labels`` order).
    """
    index = {name: i for i, name in enumerate(labels)}
    unknown = sorted({y for y in [*y_true, *y_pred] if y not in index})
    if unknown:
        raise LabelSetMismatch(f"labels {unknown} are not in the label set {list(labels)}")
    t = np.fromiter((index[y] for y in y_true), dtype=np.int64, count=len(y_true))
    p = np.fromiter((index[y] for y in y_pred), dtype=np.int64, count=len(y_pred))
    from sklearn.metrics import confusion_matrix  # not at import: definitions stay sklearn-free

    per_class = f1_per_class(t, p, len(labels))
    return {
        "samples": int(len(t)),
        "accuracy": float((t == p).mean()) if len(t) else 0.0,
        "macro_f1": macro_f1(t, p),
        "f1_per_class": {name: float(f) for name, f in zip(labels, per_class)},
        "labels": list(labels),
        "confusion_matrix": confusion_matrix(t, p, labels=range(len(labels))).tolist(),
    }


def f1_per_class(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> np.ndarray:
    """scikit-learn's F1 of each class id in ``range(num_classes)`` (0 for a class never seen)."""
    from sklearn.metrics import f1_score  # lazy: as in scores

    if num_classes == 0:
        return np.zeros(0)
    return f1_score(
        y_true, y_pred, labels=list(range(num_classes)), average=None, zero_division=0.0
    )


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean F1 over the classes present in the truth or the predictions.

    A class with neither support nor predictions has no F1 (0/0); scikit-learn's default and the
    trainer's torchmetrics both leave it out of the mean, so this does too.
    """
    from sklearn.metrics import f1_score  # lazy: as in scores

    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    present = np.union1d(y_true, y_pred)
    if len(present) == 0:
        return 0.0
    return float(f1_score(y_true, y_pred, labels=present, average="macro", zero_division=0.0))


def majority_scores(
    train_labels: Sequence[str], y_true: Sequence[str], labels: Sequence[str]
) -> dict:
    """Always answering the most frequent *training* class: the floor any model must clear."""
    values, counts = np.unique(np.asarray(list(train_labels), dtype=object), return_counts=True)
    majority = str(values[int(np.argmax(counts))]) if len(values) else labels[0]
    return {**scores(y_true, [majority] * len(y_true), labels), "majority_class": majority}


def map_labels(
    raw: Sequence[str | None], mapping: dict[str, str] | None, labels: Sequence[str], where: str
) -> list[str]:
    """Raw labels of a labelled file -> the model's label names; refuses (naming them) labels it
    cannot predict.

    A label already in ``labels`` stays; otherwise ``mapping`` over the default one (1/-1/0 and
    names; exact, then lower-case, then as a number: ``1.0`` == ``1``) decides.
    Nothing is dropped: one unknown label refuses the whole file, because a score on a silently
    shrunk set is a different benchmark.
    """
    # 1/-1/0 only where they fit
    defaults = {k: v for k, v in DEFAULT_LABEL_MAPPING.items() if v in labels}
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
        shown = ", ".join(
            f"{k!r} ({n} rows)" for k, n in sorted(unknown.items(), key=lambda kv: -kv[1])[:10]
        )
        raise LabelSetMismatch(
            f"{where}: labels {shown} do not match the model's label set {list(labels)}; map "
            "them with "
            '--label-mapping \'{"raw": "Class", ...}\' (or score a model trained on these labels)'
        )
    return out


def format_report(result: dict) -> str:
    """Accuracy, macro-F1, per-class F1 and the confusion matrix as plain text."""
    labels = result["labels"]
    width = max(8, *(len(n) for n in labels))
    lines = [
        f"samples   {result['samples']}",
        f"accuracy  {result['accuracy']:.4f}",
        f"macro-F1  {result['macro_f1']:.4f}",
        "",
        "F1 per class",
    ]
    lines += [f"  {n:<{width}} {result['f1_per_class'][n]:.4f}" for n in labels]
    lines += [
        "",
        "confusion matrix (rows: true, columns: predicted)",
        " " * (width + 2) + " ".join(f"{n[:width]:>{width}}" for n in labels),
    ]
    lines += [
        f"  {n:<{width}}" + " ".join(f"{c:>{width}}" for c in row)
        for n, row in zip(labels, result["confusion_matrix"])
    ]
    return "\n".join(lines)
