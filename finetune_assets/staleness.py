"""Code versions that change when an asset's *default* configuration changes.

Dagster's staleness sees code versions and data versions, not run config. Hyper-parameters and the
base-model source are run config, so their defaults are folded into the asset's ``code_version``:
editing a default (say ``FinetuneConfig.lr``) marks exactly that asset stale for every partition
("code version changed"), and "Materialize stale" re-runs only it and what depends on its data.
A one-off launchpad override is a deliberate choice by a person and is recorded in the run, not
treated as drift.
"""

import hashlib
import json
from collections.abc import Iterable

import dagster as dg


def config_defaults(config_cls: type[dg.Config], exclude: Iterable[str] = ()) -> dict:
    """The default value of every field that has one (fields without a default are required config)."""
    skip = set(exclude)
    out = {}
    for name, field in config_cls.model_fields.items():
        if name in skip or field.is_required():
            continue
        out[name] = field.get_default(call_default_factory=True)
    return out


def config_code_version(config_cls: type[dg.Config], revision: str, exclude: Iterable[str] = ()) -> str:
    """``{revision}-{hash of the defaults}``: bump ``revision`` for code changes; defaults count by themselves.

    ``exclude`` names fields that cannot change the output (logging cadence, worker counts, run names).
    """
    blob = json.dumps(config_defaults(config_cls, exclude), sort_keys=True, default=str)
    return f"{revision}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"
