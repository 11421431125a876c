"""Pictures for materialization metadata: small PNGs inlined in Markdown, as people read them in the
UI.

Pure (no Dagster): each ``*_md`` returns a Markdown string with a base64 ``data:image/png`` image
and the numbers as a table beneath it (so the values stay searchable and copyable); wrap it in
``dg.MetadataValue.md``. Images are kept small (about 10-30 KB) so the event log stays light.
matplotlib is imported lazily and used through its object API (no pyplot global state), which
is safe in threads and never needs a display.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence

import numpy as np

MAX_PNG_BYTES = 50_000
_DPI = 80
_COLOR = "#4F43DD"  # Dagster's accent, readable in light and dark themes


def _figure(width: float, height: float):
    # lazy: the code location imports this module, and matplotlib only loads where a chart is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    data = buf.getvalue()
    if len(data) > MAX_PNG_BYTES:  # never put a large blob into the event log
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=_DPI // 2, metadata={"Software": None})
        data = buf.getvalue()
    return data


def image_md(png: bytes, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode('ascii')})"


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")  # a cell never breaks its row


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """The one Markdown-table writer (metadata, checks, charts' number tables); cells escaped."""
    lines = ["| " + " | ".join(map(_cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in rows]
    return "\n".join(lines)


# -- label distribution ------------------------------------------------------------------------


def _bars_png(
    names: list[str],
    values: list[float],
    value_labels: list[str],
    *,
    height: float,
    x_max: float,
    xlabel: str,
    title: str,
) -> bytes:
    """Horizontal bars, the first name on top, each bar labelled at its end (``x_max`` leaves room
    for the labels).
    """
    fig = _figure(4.0, height)
    ax = fig.add_subplot()
    bars = ax.barh(names[::-1], values[::-1], color=_COLOR)
    ax.bar_label(bars, labels=value_labels[::-1], padding=3, fontsize=8)
    ax.set_xlim(0, x_max)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def label_distribution_png(counts: Mapping[str, int]) -> bytes:
    values = [int(v) for v in counts.values()]
    total = max(1, sum(values))
    return _bars_png(
        list(counts),
        values,
        [f"{v} ({v / total:.0%})" for v in values],
        height=2.2,
        x_max=max(values + [1]) * 1.35,
        xlabel="reviews",
        title="label distribution",
    )


def label_distribution_md(counts: Mapping[str, int]) -> str:
    """Bar chart + table of reviews per label (``{"Positive": 120, ...}``)."""
    total = max(1, sum(counts.values()))
    table = markdown_table(
        ("label", "reviews", "share"), [(k, v, f"{v / total:.1%}") for k, v in counts.items()]
    )
    return image_md(label_distribution_png(counts), "label distribution") + "\n\n" + table


# -- token lengths -----------------------------------------------------------------------------


def token_length_png(
    lengths: Sequence[int], max_length: int | None = None, bins: int = 40
) -> bytes:
    values = np.asarray(lengths, dtype=np.int64)
    fig = _figure(4.5, 2.4)
    ax = fig.add_subplot()
    if len(values):
        ax.hist(values, bins=min(bins, max(1, int(values.max() - values.min()) + 1)), color=_COLOR)
    if max_length is not None:
        ax.axvline(max_length, color="#D93F3F", linestyle="--", linewidth=1)
        ax.annotate(
            f"max_length {max_length}",
            xy=(max_length, 1),
            xycoords=("data", "axes fraction"),
            xytext=(3, -10),
            textcoords="offset points",
            fontsize=7,
            color="#D93F3F",
        )
    ax.set_xlabel("tokens per review (before truncation)")
    ax.set_ylabel("reviews")
    ax.set_title("token lengths", fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def token_length_md(lengths: Sequence[int], max_length: int | None = None) -> str:
    """Histogram of full token lengths, the truncation point marked, with percentiles beneath."""
    values = np.asarray(lengths, dtype=np.int64)
    if len(values):
        stats = [
            ("reviews", len(values)),
            ("mean", f"{values.mean():.1f}"),
            *((f"p{q}", int(np.percentile(values, q))) for q in (50, 90, 95, 99)),
            ("max", int(values.max())),
        ]
        if max_length is not None:
            stats.append((f"> max_length ({max_length})", f"{(values > max_length).mean():.1%}"))
    else:
        stats = [("reviews", 0)]
    return (
        image_md(token_length_png(values, max_length), "token length histogram")
        + "\n\n"
        + markdown_table(("statistic", "value"), stats)
    )


# -- confusion matrix --------------------------------------------------------------------------


def confusion_matrix_figure(matrix: Sequence[Sequence[int]], labels: Sequence[str]):
    """The heat map as a matplotlib ``Figure`` (the trainer logs it to MLflow with
    ``log_figure``).
    """
    m = np.asarray(matrix, dtype=np.int64)
    fig = _figure(3.4, 3.0)
    ax = fig.add_subplot()
    row_sums = m.sum(axis=1, keepdims=True)
    share = np.divide(m, row_sums, out=np.zeros(m.shape, dtype=float), where=row_sums > 0)
    ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            ax.text(
                j,
                i,
                str(m[i, j]),
                ha="center",
                va="center",
                fontsize=8,
                color="white" if share[i, j] > 0.5 else "black",
            )
    ax.set_title("confusion matrix (test split)", fontsize=9)
    return fig


def confusion_matrix_png(matrix: Sequence[Sequence[int]], labels: Sequence[str]) -> bytes:
    return _png(confusion_matrix_figure(matrix, labels))


def confusion_matrix_md(matrix: Sequence[Sequence[int]], labels: Sequence[str]) -> str:
    """Heat map (colour = share of the true class) + the counts as a table (rows true, columns
    predicted).
    """
    if len(matrix) != len(labels) or any(len(row) != len(labels) for row in matrix):
        raise ValueError(
            f"confusion matrix must be {len(labels)}x{len(labels)} for labels {list(labels)}"
        )
    rows = [(f"**{label}**", *row) for label, row in zip(labels, matrix)]
    return (
        image_md(confusion_matrix_png(matrix, labels), "confusion matrix")
        + "\n\n"
        + markdown_table(("true \\ predicted", *labels), rows)
    )


# -- tuning study ------------------------------------------------------------------------------


def optimization_history_png(trials: Sequence[Mapping]) -> bytes:
    """Each finished trial's value (pruned: last report, as crosses) and the best so far."""
    fig = _figure(4.8, 2.6)
    ax = fig.add_subplot()
    done = [t for t in trials if t["value"] is not None and t["state"] in ("COMPLETE", "PRUNED")]
    for state, marker, color in (("COMPLETE", "o", _COLOR), ("PRUNED", "x", "#999999")):
        pts = [(t["number"], t["value"]) for t in done if t["state"] == state]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, color=color, label=state.lower(), zorder=3)
    best, line = None, []
    for t in done:
        if t["state"] == "COMPLETE":
            best = t["value"] if best is None else max(best, t["value"])
        if best is not None:
            line.append((t["number"], best))
    if line:
        ax.step(*zip(*line), where="post", color=_COLOR, alpha=0.5, label="best")
    ax.set_xlabel("trial")
    ax.set_ylabel("validation macro-F1")
    ax.set_title("optimization history", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def optimization_history_md(trials: Sequence[Mapping]) -> str:
    """Chart + table: trial, state, value (``trials``: dicts with number, state, value)."""
    rows = [
        (t["number"], t["state"].lower(), "" if t["value"] is None else f"{t['value']:.4f}")
        for t in trials
    ]
    table = markdown_table(("trial", "state", "validation macro-F1"), rows)
    return image_md(optimization_history_png(trials), "optimization history") + "\n\n" + table


def param_importance_png(importances: Mapping[str, float]) -> bytes:
    values = [float(v) for v in importances.values()]
    return _bars_png(
        list(importances),
        values,
        [f"{v:.2f}" for v in values],
        height=0.5 + 0.3 * max(1, len(importances)),
        x_max=max(values + [0.01]) * 1.3,
        xlabel="importance (fANOVA)",
        title="parameter importance",
    )


def param_importance_md(importances: Mapping[str, float]) -> str:
    """Bar chart + table of each parameter's share of the value's variance (``{"lr": 0.7}``)."""
    rows = [(k, f"{v:.3f}") for k, v in importances.items()]
    table = markdown_table(("parameter", "importance"), rows)
    return image_md(param_importance_png(importances), "parameter importance") + "\n\n" + table
