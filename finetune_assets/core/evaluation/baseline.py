"""The linear baseline every fine-tuned model must beat: TF-IDF word + character n-grams, logistic
regression.

Trained in seconds on CPU on the same train split and scored on the same frozen test split as the
fine-tuned model, it answers "is the expensive model any good?" for any data and any base model:
character n-grams need no vocabulary, so the baseline stays honest where a base model's tokenizer
does not fit the language. Saved as plain arrays and JSON (``baseline.npz``: idf weights and
coefficients; ``vocabulary.json``; ``baseline.json``: recipe, labels, scores), so loading never
unpickles code from the storage root and takes well under a second. No Dagster here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from finetune_assets.core.evaluation.evaluate import order_labels, scores

MODEL_FILE = "baseline.npz"  # idf per analyzer, coefficients, intercepts, classes
VOCAB_FILE = "vocabulary.json"  # term -> column, per analyzer
INFO_FILE = "baseline.json"  # label set + settings + test scores, readable without scikit-learn
ANALYZERS = ("word", "char")


@dataclass(frozen=True)
class BaselineSettings:
    """The baseline's recipe; ``class_weight`` balanced by default like the fine-tuned model
    (macro-F1 counts).
    """

    word_ngrams: tuple[int, int] = (1, 2)
    char_ngrams: tuple[int, int] = (2, 5)
    min_df: int = 2
    max_features: int = 200_000  # per analyzer
    C: float = 4.0
    class_weight: str | None = "balanced"
    max_iter: int = 2000

    def __post_init__(self):
        if self.class_weight not in (None, "balanced"):
            raise ValueError(f"class_weight must be 'balanced' or None, not {self.class_weight!r}")
        if self.C <= 0 or self.min_df < 1 or self.max_features < 1:
            raise ValueError("C must be > 0, min_df >= 1, max_features >= 1")


def build_pipeline(settings: BaselineSettings):
    # lazy: the code location imports this module; scikit-learn loads only where a baseline is fit
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion, Pipeline

    def tfidf(analyzer: str, ngrams: tuple[int, int]):
        return TfidfVectorizer(
            analyzer=analyzer,
            ngram_range=tuple(ngrams),
            min_df=settings.min_df,
            max_features=settings.max_features,
            sublinear_tf=True,
            lowercase=True,
            dtype=np.float32,
        )

    features = FeatureUnion(
        [
            ("word", tfidf("word", settings.word_ngrams)),
            ("char", tfidf("char_wb", settings.char_ngrams)),
        ]
    )
    clf = LogisticRegression(
        C=settings.C, class_weight=settings.class_weight, max_iter=settings.max_iter
    )
    return Pipeline([("tfidf", features), ("clf", clf)])


class BaselineModel:
    """A fitted baseline and its label set; ``predict`` has the CLI classifier's shape."""

    def __init__(
        self, pipeline, labels: Sequence[str], settings: BaselineSettings, source: str = "baseline"
    ):
        self.pipeline = pipeline
        self.labels = list(labels)
        self.settings = settings
        self.source = source

    @classmethod
    def fit(
        cls,
        texts: Sequence[str],
        labels: Sequence[str],
        settings: BaselineSettings | None = None,
        label_set: Sequence[str] | None = None,
    ) -> BaselineModel:
        settings = settings or BaselineSettings()
        if len(texts) != len(labels):
            raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
        classes = set(labels)
        if len(classes) < 2:
            raise ValueError(
                "the baseline needs at least two classes in the training split, got "
                f"{sorted(classes)}"
            )
        # min_df counts documents: on a tiny split it must not remove every term
        if settings.min_df > 1 and len(texts) < 20 * settings.min_df:
            settings = BaselineSettings(**{**asdict(settings), "min_df": 1})
        pipeline = build_pipeline(settings).fit(list(texts), list(labels))
        return cls(pipeline, order_labels(list(label_set or []) + list(classes)), settings)

    def predict_labels(
        self, texts: Sequence[str], max_length: int | None = None, batch_size: int | None = None
    ) -> list[str]:
        """The class per text; the signature of ``inference.Classifier.predict_labels`` (no
        tokenizer, no batches).
        """
        return [str(x) for x in self.pipeline.predict(list(texts))] if len(texts) else []

    def predict(
        self, texts: Sequence[str], max_length: int | None = None
    ) -> list[tuple[str, float, dict]]:
        """(label, probability, probabilities by label) per text; ``max_length`` is ignored (no
        tokenizer).
        """
        probs = self.pipeline.predict_proba(list(texts))
        classes = [str(c) for c in self.pipeline.classes_]
        out = []
        for row in probs:
            by_label = {name: 0.0 for name in self.labels}
            by_label.update({c: float(p) for c, p in zip(classes, row)})
            best = classes[int(np.argmax(row))]
            out.append((best, by_label[best], by_label))
        return out

    def evaluate(self, texts: Sequence[str], labels: Sequence[str]) -> dict:
        return scores(list(labels), self.predict_labels(texts), self.labels)

    def save(self, folder: Path, info: dict | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        vectorizers = dict(self.pipeline.named_steps["tfidf"].transformer_list)
        clf = self.pipeline.named_steps["clf"]
        with (folder / MODEL_FILE).open("wb") as f:
            np.savez_compressed(
                f,
                coef=clf.coef_,
                intercept=clf.intercept_,
                classes=np.asarray(clf.classes_, dtype=str),
                **{f"idf_{a}": vectorizers[a].idf_ for a in ANALYZERS},
            )
        vocab = {
            a: sorted(vectorizers[a].vocabulary_, key=vectorizers[a].vocabulary_.get)
            for a in ANALYZERS
        }
        (folder / VOCAB_FILE).write_text(json.dumps(vocab, ensure_ascii=False))
        self.save_info(folder, info)

    def save_info(self, folder: Path, info: dict | None = None) -> None:
        (folder / INFO_FILE).write_text(
            json.dumps(
                {**(info or {}), "labels": self.labels, "recipe": asdict(self.settings)}, indent=2
            )
        )

    @classmethod
    def load(cls, folder: Path, source: str | None = None) -> BaselineModel:
        """Rebuild the fitted pipeline from arrays + vocabularies (``allow_pickle=False``: data
        only).
        """
        if not all((folder / f).is_file() for f in (MODEL_FILE, VOCAB_FILE, INFO_FILE)):
            raise FileNotFoundError(
                f"{folder} lacks {MODEL_FILE}, {VOCAB_FILE} or {INFO_FILE}: "
                "not a baseline_model folder"
            )
        info = json.loads((folder / INFO_FILE).read_text())
        recipe = {k: tuple(v) if isinstance(v, list) else v for k, v in info["recipe"].items()}
        settings = BaselineSettings(**recipe)
        pipeline = build_pipeline(settings)
        vocab = json.loads((folder / VOCAB_FILE).read_text())
        with np.load(folder / MODEL_FILE, allow_pickle=False) as arrays:
            for name, vectorizer in pipeline.named_steps["tfidf"].transformer_list:
                vectorizer.vocabulary_ = {term: i for i, term in enumerate(vocab[name])}
                vectorizer.idf_ = arrays[f"idf_{name}"]
            clf = pipeline.named_steps["clf"]
            clf.coef_, clf.intercept_ = arrays["coef"], arrays["intercept"]
            clf.classes_ = arrays["classes"].astype(object)
            clf.n_features_in_ = clf.coef_.shape[1]
        return cls(pipeline, info["labels"], settings, source or str(folder))


@dataclass(frozen=True)
class Decision:
    """Whether a challenger clears its own version's baseline; the three numbers travel with it."""

    passed: bool
    challenger_macro_f1: float
    baseline_macro_f1: float
    margin: float
    reason: str


def beats_baseline(
    challenger_metrics: dict, baseline_metrics: dict, margin: float = 0.0
) -> Decision:
    """Promote only a model whose test macro-F1 is at least the baseline's plus ``margin``.

    Both metric dicts come from the same frozen test split (``finetuned_model``'s ``metrics.json``
    and ``baseline_model``'s ``baseline.json``: ``macro_f1``); a tie passes at margin 0.
    """
    challenger = float(challenger_metrics["macro_f1"])
    baseline = float(baseline_metrics["macro_f1"])
    needed = baseline + margin
    passed = challenger >= needed - 1e-12
    verb = "beats" if passed else "does not beat"
    reason = (
        f"macro-F1 {challenger:.4f} {verb} the baseline's {baseline:.4f} + margin {margin:.4f} "
        f"(needs >= {needed:.4f})"
    )
    return Decision(passed, challenger, baseline, margin, reason)
