"""Model promotion: score a challenger and the current champion on the same frozen test reviews.

Kept free of Dagster (the asset check is a thin wrapper), so a person can re-run a decision by hand.

"Same test data" means the same *texts and labels*: the test split of a dataset version (fixed by
each review's text hash, so a newer version's test split is a superset of an older one's). Each
model is scored from the raw test texts with *its own* tokenizer, so a champion trained on another
base model (another vocabulary) is still compared fairly. Scores are cached on the MLflow model
version as tags keyed by the test data's hash, so a champion is re-scored only when the test data
changed.
"""

import contextlib
import hashlib
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from finetune_assets.core.evaluation.baseline import beats_baseline as baseline_verdict
from finetune_assets.core.evaluation.evaluate import macro_f1
from finetune_assets.core.evaluation.inference import Classifier
from finetune_assets.core.labels.infer import LABELS

CHAMPION_ALIAS = "champion"
TAG_SCORE = "gate.macro_f1"  # score on the test data named by TAG_TEST_DATA
TAG_TEST_DATA = "gate.test_data"
TAG_DECISION = "gate.decision"


@dataclass(frozen=True)
class TestSet:
    texts: list[str]
    labels: np.ndarray  # label ids in ``names`` order
    fingerprint: str  # hash of (text, label) pairs, order-independent
    names: tuple[str, ...] = LABELS  # the dataset version's classes

    @classmethod
    def build(
        cls, texts: list[str], labels: list[str], names: tuple[str, ...] = LABELS
    ) -> "TestSet":
        if len(texts) != len(labels):
            raise ValueError(f"test set: {len(texts)} texts but {len(labels)} labels")
        pairs = sorted(zip(texts, labels))
        digest = hashlib.sha256()
        for t, lab in pairs:
            digest.update(t.encode() + b"\x00" + lab.encode() + b"\x01")
        label2id = {n: i for i, n in enumerate(names)}
        return cls(
            [t for t, _ in pairs],
            np.asarray([label2id[lab] for _, lab in pairs], dtype=np.int64),
            digest.hexdigest()[:16],
            tuple(names),
        )


def majority_baseline(test: TestSet) -> float:
    """Macro-F1 of always predicting the most frequent test class: the floor any model must
    clear.
    """
    if len(test.labels) == 0:
        return 0.0
    majority = int(np.bincount(test.labels, minlength=len(test.names)).argmax())
    return macro_f1(test.labels, np.full_like(test.labels, majority))


def score_model(root: Path, test: TestSet, max_length: int = 512, batch_size: int = 32) -> float:
    """Macro-F1 of a saved classifier on the test texts (``inference.Classifier``, the model's
    own tokenizer).
    """
    classifier = Classifier.from_folder(root)
    # Map the model's class names to our label ids by name (a model saved with other ids still
    # scores right).
    label2id = {n: i for i, n in enumerate(test.names)}
    unknown = sorted(set(classifier.labels) - set(label2id))
    if unknown:
        raise ValueError(
            f"{root}: the model predicts {unknown}, not classes of the test data {list(test.names)}"
        )
    predicted = classifier.predict_labels(test.texts, max_length, batch_size)
    preds = np.fromiter(
        (label2id[name] for name in predicted), dtype=np.int64, count=len(predicted)
    )
    return macro_f1(test.labels, preds)


@dataclass(frozen=True)
class Champion:
    version: str
    cached_score: float | None  # its score on this test data, when a previous gate computed it
    dataset_version: str | None
    run_id: str | None


NOT_FOUND_CODES = frozenset({"RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"})


def is_not_found(err: Exception) -> bool:
    """Whether an MLflow error says "no such registered model" (and nothing else: locks, outages,
    auth).
    """
    return getattr(err, "error_code", None) in NOT_FOUND_CODES


def current_champion(
    client, name: str, test: TestSet, alias: str = CHAMPION_ALIAS
) -> Champion | None:
    """The version holding ``alias`` of registered model ``name``; None only when there provably is
    none.

    The alias is read from the registered model itself (an absent alias is then a fact, not an error
    message to parse); only "registered model not found" means no champion. Any other registry error
    (SQLite "database is locked", a server outage) propagates: the caller fails and the alias stays.
    """
    # lazy, as every mlflow import here: it takes seconds, and the rules themselves need none
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(name)
    except MlflowException as err:
        if is_not_found(err):
            return None
        raise
    holder = (model.aliases or {}).get(alias)
    if holder is None:
        return None
    mv = client.get_model_version(name, str(holder))
    tags = mv.tags or {}
    cached = (
        float(tags[TAG_SCORE])
        if tags.get(TAG_TEST_DATA) == test.fingerprint and TAG_SCORE in tags
        else None
    )
    return Champion(
        version=str(mv.version),
        cached_score=cached,
        dataset_version=tags.get("dataset_version"),
        run_id=mv.run_id,
    )


def score_registered(client, name: str, version: str, test: TestSet, tracking_uri: str) -> float:
    """Download a registered model version and score it (then cache the score as a tag on the
    version).
    """
    import mlflow  # lazy: see current_champion

    # Resolve the version through *this* client's registry: a ``models:/name/version`` URI would be
    # resolved against mlflow's process-global registry URI instead (unset in a Dagster run:
    # ./mlflow.db).
    source = client.get_model_version_download_uri(name, version)
    with tempfile.TemporaryDirectory(prefix="champion-") as tmp:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=source, dst_path=tmp, tracking_uri=tracking_uri
        )
        score = score_model(Path(local), test)
    remember_score(client, name, version, test, score)
    return score


def remember_score(client, name: str, version: str, test: TestSet, score: float) -> None:
    client.set_model_version_tag(name, version, TAG_TEST_DATA, test.fingerprint)
    # Full precision: a rounded cache could rank an equally good challenger below the champion.
    client.set_model_version_tag(name, version, TAG_SCORE, repr(float(score)))


# -- promotion: one decision rule for the check (observes) and the champion_model asset (acts) -----


@dataclass(frozen=True)
class Challenger:
    """The exact registered version a run produced, with its score on its dataset version's test
    split.
    """

    name: str
    version: str
    score: float
    dataset_version: str | None = None  # the dataset version it was trained on


@dataclass(frozen=True)
class Comparison:
    challenger: Challenger
    champion: Champion | None
    champion_score: float | None
    test: TestSet
    refusals: tuple[str, ...] = ()  # why the challenger may not take the alias; empty: it may

    @property
    def promotable(self) -> bool:
        return not self.refusals and not self.holds_alias

    @property
    def holds_alias(self) -> bool:
        return self.champion is not None and self.champion.version == self.challenger.version


# A condition returns None when the challenger satisfies it, else the reason it is refused.
# Promotion takes a list of them: another rule (say "beats its version's baseline by a margin") is
# one more item.
Condition = Callable[[Comparison], str | None]


def above_floor(floor: float) -> Condition:
    def condition(c: Comparison) -> str | None:
        if c.challenger.score >= floor:
            return None
        return f"macro-F1 {c.challenger.score:.4f} is below the floor {floor:.4f}"

    return condition


def beats_baseline(baseline_metrics: dict, margin: float) -> Condition:
    """At least its own version's baseline_model test macro-F1 plus ``margin``."""

    def condition(c: Comparison) -> str | None:
        verdict = baseline_verdict({"macro_f1": c.challenger.score}, baseline_metrics, margin)
        return None if verdict.passed else verdict.reason

    return condition


def beats_champion(min_improvement: float = 0.0) -> Condition:
    """Strictly better than the champion (by more than ``min_improvement``): a tie keeps the
    champion, so a retry that reproduces the same model never moves the alias.
    """

    def condition(c: Comparison) -> str | None:
        if c.champion is None or c.holds_alias or c.champion_score is None:
            return None
        if c.challenger.score > c.champion_score + min_improvement:
            return None
        return (
            f"macro-F1 {c.challenger.score:.4f} does not beat champion v{c.champion.version}'s "
            f"{c.champion_score:.4f} (by more than {min_improvement:g}) on the same "
            f"{len(c.test.texts)} "
            "test reviews"
        )

    return condition


def not_older_than_champion(registered_at: Callable[[str], float | None]) -> Condition:
    """A challenger trained on a dataset version registered before the champion's is refused.

    Each decision scores both models on the challenger's own version's frozen test split; without
    this rule, retraining an old version after a newer champion could displace it on that smaller,
    older test set, so which model is champion would depend on evaluation order. Versions of one
    label set only move forward: the same version retrained (new hyper-parameters) is compared as
    before; an unknown order (no registry record, no tag) does not refuse.
    """

    def condition(c: Comparison) -> str | None:
        champ, mine = c.champion, c.challenger.dataset_version
        if champ is None or c.holds_alias or not champ.dataset_version or not mine:
            return None
        if champ.dataset_version == mine:
            return None
        ours, theirs = registered_at(mine), registered_at(champ.dataset_version)
        if ours is None or theirs is None or ours >= theirs:
            return None
        return (
            f"dataset version {mine} was registered before champion v{champ.version}'s "
            f"{champ.dataset_version}: an older version cannot displace a newer champion"
        )

    return condition


def compare(
    client,
    challenger: Challenger,
    test: TestSet,
    conditions: Sequence[Condition],
    tracking_uri: str,
    alias: str = CHAMPION_ALIAS,
) -> Comparison:
    """Read the champion (scoring it on ``test`` unless cached) and apply every condition;
    changes no alias.
    """
    champ = current_champion(client, challenger.name, test, alias)
    champ_score = None
    if champ is not None:
        champ_score = (
            challenger.score if champ.version == challenger.version else champ.cached_score
        )
        if champ_score is None:
            champ_score = score_registered(
                client, challenger.name, champ.version, test, tracking_uri
            )
    base = Comparison(challenger, champ, champ_score, test)
    refusals = tuple(r for cond in conditions if (r := cond(base)) is not None)
    return Comparison(challenger, champ, champ_score, test, refusals)


def describe(c: Comparison, alias: str = CHAMPION_ALIAS) -> str:
    if c.holds_alias:
        return f"kept: v{c.challenger.version} already holds @{alias}"
    if c.refusals:
        held = f"; @{alias} stays on v{c.champion.version}" if c.champion else ""
        return "refused: " + "; ".join(c.refusals) + held
    if c.champion is None:
        return f"promoted: first model to hold @{alias}"
    return (
        f"promoted: macro-F1 {c.challenger.score:.4f} > champion v{c.champion.version}'s "
        f"{c.champion_score:.4f} on the same {len(c.test.texts)} test reviews"
    )


def promote(
    client,
    challenger: Challenger,
    test: TestSet,
    conditions: Sequence[Condition],
    tracking_uri: str,
    alias: str = CHAMPION_ALIAS,
    lock: contextlib.AbstractContextManager | None = None,
) -> Comparison:
    """Compare and, if every condition holds, move ``alias`` to the challenger, inside one critical
    section.

    MLflow has no compare-and-set on aliases: ``lock`` (plus the ``promotion`` pool of size 1 around
    the asset) makes read, compare and set one step, so finish order never decides the champion. A
    registry error while reading propagates before anything is set.
    """
    with lock or contextlib.nullcontext():
        result = compare(client, challenger, test, conditions, tracking_uri, alias)
        if result.promotable:
            client.set_registered_model_alias(challenger.name, alias, challenger.version)
    if not result.holds_alias:
        client.set_model_version_tag(
            challenger.name, challenger.version, TAG_DECISION, describe(result, alias)[:250]
        )
    return result
