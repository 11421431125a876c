"""`summary`: what the first command ends with: rows, test scores, champion or not."""

from __future__ import annotations

from finetune_assets.cli.common import CliError, open_storage, print_json, tracking_uri_of

# Project and third-party modules are imported inside the functions that use them, never
# here: `--help`, and `predict` on a local folder, load neither Dagster nor MLflow
# (cli/__init__.py).


def version_summary(storage, version: str, tracking_uri: str | None) -> dict:
    """What the first command ends with: rows, test scores of fine-tuned / baseline / majority,
    champion or not.
    """
    from finetune_assets.core.evaluation.baseline import INFO_FILE
    from finetune_assets.core.io.contracts import (
        BASELINE_MODEL,
        FINETUNED_MODEL,
        RAW_REVIEWS,
        TOKENIZED_REVIEWS,
        read_token_stats,
        read_training_result,
    )

    raw, tokens = storage.current(RAW_REVIEWS, version), storage.current(TOKENIZED_REVIEWS, version)
    model, base = (
        storage.current(FINETUNED_MODEL, version),
        storage.current(BASELINE_MODEL, version),
    )
    out: dict = {
        "version": version,
        "rows": raw.metadata.get("rows") if raw else None,
        "rejected": raw.metadata.get("rejected") if raw else None,
    }
    out["splits"] = read_token_stats(tokens.url, storage.fs).splits if tokens else None
    try:
        result = read_training_result(model.url, storage.fs) if model else None
    # a model folder published without the trainer's result: no scores to show
    except FileNotFoundError:
        result = None
    out["finetuned"] = (
        {"accuracy": result.accuracy, "macro_f1": result.macro_f1} if result else None
    )
    sel = result.model_selection if result else None
    out["model_selection"] = (
        {
            "selected": sel.selected,
            "best_epoch": sel.best_epoch,
            "best_val_macro_f1": sel.best_value,
            "epochs_trained": result.epochs,
            "early_stopped": sel.early_stopped,
            "stopped_at_epoch": sel.stopped_at_epoch,
        }
        if sel
        else None
    )
    info = storage.read_json(f"{base.url}/{INFO_FILE}") if base else None
    test = (info or {}).get("test")
    out["baseline"] = {k: test[k] for k in ("accuracy", "macro_f1")} if test else None
    majority = (info or {}).get("majority")
    out["majority"] = {k: majority[k] for k in ("accuracy", "macro_f1")} if majority else None
    reg = ((model.metadata if model else {}) or {}).get("mlflow") or {}
    out["registered_model"] = (
        f"{reg['registered_model_name']} v{reg['registered_model_version']}"
        if reg.get("registered_model_version") is not None
        else None
    )
    out["tuning"] = tuning_outcome(storage, version, model.metadata if model else None)
    out["champion"], out["gate_decision"] = None, None
    if reg.get("registered_model_version") is not None and tracking_uri:
        _champion_status(out, reg, tracking_uri)
    return out


def _champion_status(out: dict, reg: dict, tracking_uri: str) -> None:
    """The quality gate's decision on the version's registered model and whether it holds
    @champion, into ``out``; what MLflow could not tell is said as the decision.
    """
    try:
        from mlflow.exceptions import MlflowException

        from finetune_assets.defs.resources.mlflow import MlflowResource

        client = MlflowResource.client_at(tracking_uri)
        name, mine = reg["registered_model_name"], str(reg["registered_model_version"])
        out["gate_decision"] = (client.get_model_version(name, mine).tags or {}).get(
            "gate.decision"
        )
        try:
            holder = str(client.get_model_version_by_alias(name, "champion").version)
        except MlflowException:
            holder = None
        out["champion"] = holder == mine
        out["champion_version"] = holder
    except Exception as err:  # the summary reports what it could not read
        out["gate_decision"] = f"(MLflow not readable: {err})"


def tuning_outcome(storage, version: str, model_metadata: dict | None) -> dict | None:
    """How the version's last study ended and whether the model is its winner (None: never
    tuned). A failed or cut-short study leaves the default recipe's model
    (defs/tuning/on_landing.py).
    """
    outcome = storage.read_json(storage.url("tuning", version, "outcome.json"))
    if not outcome:
        return None
    trial = (model_metadata or {}).get("tuned_from_trial")
    return {
        **outcome,
        "model": f"the study's trial {trial}" if trial is not None else "the default recipe",
    }


def format_summary(s: dict) -> str:
    def cells(m):
        return f"{m['accuracy']:>9.4f}  {m['macro_f1']:>9.4f}" if m else f"{'-':>9}  {'-':>9}"

    splits = s.get("splits") or {}
    lines = [
        f"dataset version {s['version']}: {s['rows'] if s['rows'] is not None else '?'} reviews "
        f"({s['rejected'] or 0} rejected)"
        + (
            f"; train {splits.get('train')} / validation "
            f"{splits.get('validation')} / test {splits.get('test')}"
            if splits
            else ""
        ),
        f"{'on the test split':<22}{'accuracy':>9}  {'macro-F1':>9}",
        f"{'fine-tuned model':<22}{cells(s['finetuned'])}",
        f"{'baseline (TF-IDF+LR)':<22}{cells(s['baseline'])}",
        f"{'majority class':<22}{cells(s['majority'])}",
    ]
    sel = s.get("model_selection")
    if sel:
        lines.append(_selection_line(sel))
    tuning = s.get("tuning")
    if tuning:
        state = "complete" if tuning["complete"] else f"failed: {tuning['why']}"
        lines.append(f"tuning: study {tuning['study']} {state}; the model is {tuning['model']}")
    if s["champion"] is True:
        lines.append(f"champion: yes, {s['registered_model']} holds @champion")
    elif s["champion"] is False:
        holder = (
            f"@champion is on v{s['champion_version']}"
            if s.get("champion_version")
            else "no model holds @champion"
        )
        lines.append(
            f"champion: no, {holder} "
            f"({s['gate_decision'] or 'the quality gate has not decided yet'})"
        )
    else:
        lines.append(
            f"champion: unknown ({s['gate_decision'] or 'no registered model or MLflow store'})"
        )
    return "\n".join(lines)


def _selection_line(sel: dict) -> str:
    """Which epoch's weights the fine-tuned model is and why training stopped where it did."""
    if sel["best_epoch"] is None:
        return "fine-tuned weights: the last (no validation)"
    which = (
        f"best validation macro-F1 {sel['best_val_macro_f1']:.4f} at epoch {sel['best_epoch']}"
        if sel["selected"] == "best"
        else f"the last epoch's (best validation was epoch {sel['best_epoch']})"
    )
    stop = (
        f"early stopping fired after epoch {sel['stopped_at_epoch']}"
        if sel["early_stopped"]
        else "no early stopping"
    )
    return f"fine-tuned weights: {which}; {stop}"


def cmd_summary(args) -> int:
    from finetune_assets.core.versions.keys import validate_version_key

    version = validate_version_key(args.version)
    storage = open_storage(args)
    if storage.current("raw_reviews", version) is None:
        raise CliError(
            f"dataset version {version!r} has no materialized raw_reviews under {storage.root}"
        )
    try:
        uri = tracking_uri_of(args)
    except CliError:
        uri = None
    summary = version_summary(storage, version, uri)
    if args.json:
        print_json(summary)
    else:
        print(format_summary(summary))
    return 0


def register(sub) -> None:
    """`summary`."""
    sm = sub.add_parser(
        "summary", help="a version's rows, test scores (fine-tuned, baseline, majority), champion"
    )
    sm.add_argument("version")
    sm.add_argument("--tracking-uri", help="MLflow tracking URI (default as for predict)")
    sm.add_argument("--json", action="store_true")
    sm.set_defaults(func=cmd_summary)
