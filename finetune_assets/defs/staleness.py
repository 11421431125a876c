"""Code versions that change when an asset's code *or* its default configuration changes.

Dagster's staleness sees code versions and data versions, not run config. Every configurable asset's
defaults (its ``dg.Config`` class) are folded into its ``code_version`` once, at the root
(``definitions.build_defs``): the decorator's ``code_version`` is the code revision (bump it for a
change of the asset's code) and this adds ``-{hash of the defaults}``. Editing a default (say
``TokenizeConfig.max_length``) then marks that asset stale for every partition ("code version
changed"), and "Materialize stale" re-runs it and what depends on its data. A one-off launchpad
override is a deliberate choice by a person and is recorded in the run, not treated as drift.

Fields that cannot change an asset's output (worker counts, batch sizes of a pure transform, logging
cadence, run names) are named in the Config class's ``unversioned`` tuple and left out.
"""

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import get_type_hints

import dagster as dg


def config_defaults(config_cls: type[dg.Config]) -> dict:
    """The default of every field that has one, less ``unversioned`` (required fields have no
    default).
    """
    skip = set(getattr(config_cls, "unversioned", ()))
    unknown = skip - set(config_cls.model_fields)
    if unknown:
        raise ValueError(f"{config_cls.__name__}.unversioned names no field: {sorted(unknown)}")
    return {
        name: field.get_default(call_default_factory=True)
        for name, field in config_cls.model_fields.items()
        if name not in skip and not field.is_required()
    }


def config_code_version(config_cls: type[dg.Config], revision: str) -> str:
    """``{revision}-{hash of the defaults}``."""
    blob = json.dumps(config_defaults(config_cls), sort_keys=True, default=str)
    return f"{revision}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def config_class(asset: dg.AssetsDefinition | dg.AssetSpec) -> type[dg.Config] | None:
    """The ``dg.Config`` class of the asset function's ``config`` parameter (None: not
    configurable, or an asset without a function such as ``champion``).
    """
    if not isinstance(asset, dg.AssetsDefinition) or not asset.is_executable:
        return None
    hints = get_type_hints(asset.op.compute_fn.decorated_fn)
    cls = hints.get("config")
    return cls if isinstance(cls, type) and issubclass(cls, dg.Config) else None


def with_config_versions(assets: Iterable[dg.AssetsDefinition]) -> Sequence[dg.AssetsDefinition]:
    """Each configurable asset with its config defaults folded into its code version (call once,
    at the root).
    """
    out = []
    for asset in assets:
        cls = config_class(asset)
        if cls is not None:
            asset = asset.map_asset_specs(
                lambda spec, cls=cls: spec.replace_attributes(
                    code_version=config_code_version(cls, spec.code_version)
                )
            )
        out.append(asset)
    return out
