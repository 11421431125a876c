"""The slice workers ``tokenized_reviews`` and ``mds_shards`` fan out (``core/shards/slices.py``),
run as one step, and the data version of what they write: a function of the inputs only.
"""

import hashlib
import json
import re

import dagster as dg

from finetune_assets.core.launchers.fanout import FanOut, FanOutError, python_module
from finetune_assets.core.shards.slices import WORKER_ENV


def fan_out(
    context: dg.AssetExecutionContext, runner, kind: str, spec_url: str, count: int
) -> None:
    """Run the slice workers; a failed slice fails the step (and nothing is published)."""
    # DNS-1123 (a Kubernetes Job name): lower-case alphanumerics and "-", <= 52 characters, the run
    # id kept
    name = re.sub(r"[^a-z0-9-]+", "-", f"{kind}-{context.run.run_id[:8]}".lower())[-52:].strip("-")
    # code: the same interpreter/image, cwd and PYTHONPATH
    job = FanOut(
        name=name,
        command=python_module("finetune_assets.core.shards.slices", "work", "--spec", spec_url),
        count=count,
        env=dict(WORKER_ENV),
    )
    try:
        runner.run(job, context.log.info)
    except FanOutError as err:
        raise dg.Failure(str(err)) from err


def inputs_digest(*parts) -> str:
    """A data version from what the workers were given (the same whatever the slicing)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
