"""Where a node's copies of the MDS splits live: per run and attempt, sized, cleaned after a kill.

Every split is read through a local cache folder (never in place: streaming would decompress into
the published folder). These functions name those folders, size a node's share of the shards, read
the splits' indexes, and remove the shared memory a killed run left behind.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import uuid
from pathlib import Path
from typing import Any

from streaming.base.util import clean_stale_shared_memory

from finetune_assets.core.training.checkpoints import trainer_files as files
from finetune_assets.core.training.config import DataConfig

_STREAMING_SHM = re.compile(r"\d{6}_\w+")  # streaming's segment names: f"{prefix:06}_{name}"


def clean_stale_streaming_memory() -> int:
    """Unlink streaming's shared-memory segments that no live process maps or holds open; how many.

    A SIGKILLed run leaves its segments behind, naming its local folders. streaming's own
    ``clean_stale_shared_memory()`` unlinks *every* segment from prefix 0 up to the first gap, the
    live ones of other trainings on this machine included, and misses stale ones after a gap. This
    looks at ``/proc`` instead (Linux; elsewhere it falls back to streaming's function).
    """
    shm = Path("/dev/shm")
    if not shm.is_dir() or not Path("/proc/self/maps").exists():
        clean_stale_shared_memory()
        return 0
    names = {p.name for p in shm.iterdir() if _STREAMING_SHM.fullmatch(p.name)}
    if not names:
        return 0
    used: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                if "/dev/shm/" in line:
                    used.add(line.split("/dev/shm/", 1)[1].split()[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    used.add(target[len("/dev/shm/") :].split()[0])
        except OSError:  # the process ended, or is not ours to inspect
            continue
    stale = names - used
    for name in stale:
        (shm / name).unlink(missing_ok=True)
    return len(stale)


def read_index(url: str, split: str) -> dict[str, Any]:
    """The split's MDS ``index.json`` (local path or fsspec URL); a clear error if there is none."""
    path = f"{files.local_path(url).rstrip('/')}/index.json"
    try:
        return files.read_json(path)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{split} split: no MDS dataset (index.json) at {url}") from err
    except ValueError as err:
        raise ValueError(f"{split} split: {path} is not valid JSON: {err}") from err


def num_samples(index: dict[str, Any]) -> int:
    return sum(int(shard.get("samples", 0)) for shard in index.get("shards", []))


def cache_limit_bytes(index: dict[str, Any], num_nodes: int) -> int:
    """A split's ``cache_limit`` on one node, sized from its index: this node's share of the shards.

    Training partitions samples over canonical nodes (contiguous ranges, at least one per node) and
    evaluation reads one contiguous block per rank, so a node touches about ``1/num_nodes`` of the
    shards; on top: the index, the shards straddling its range's two ends and streaming's minimum of
    four of the largest shard (raw + zip) while one downloads and decompresses.
    """
    shards = index.get("shards", [])
    sizes = [
        int((s.get("raw_data") or {}).get("bytes", 0))
        + int((s.get("zip_data") or {}).get("bytes", 0))
        for s in shards
    ]
    if not sizes:
        return 0
    index_bytes = len(json.dumps(index)) + 1024
    return index_bytes + math.ceil(sum(sizes) / max(1, num_nodes)) + 6 * max(sizes)


def cache_root(
    config: DataConfig, run_key: str, attempt: str | None = None
) -> tuple[str, str | None]:
    """(folder, folder to remove after success or None) for the local copies of the splits.

    ``config.local_cache_dir`` when set (kept: the caller owns it). Otherwise
    ``{scratch}/mds-cache/{hash of run_key}/{attempt}`` where ``{scratch}`` is
    :func:`files.scratch_root` (the pods' cache volume, not the small ``/tmp`` that also holds
    HOME): ``run_key`` (the checkpoint dir and the splits' indexes) separates runs and shard
    versions, and ``attempt`` (the token every rank of this start of the worker group agreed on, see
    ``process_group.agree_on_attempt``; else run id + this agent's restart count, which stays the
    same when an agent restarts its workers for another node's failure) separates restarts. A
    SIGKILLed worker leaves its streaming shared memory behind, naming its local folders; reusing
    those folders in the next attempt fails with "Reused local directory", so every attempt gets
    fresh ones. The trainer removes the run's folder (with what killed attempts left) after a
    successful run.
    """
    if config.local_cache_dir:
        return files.local_path(config.local_cache_dir), None
    run = hashlib.sha256(run_key.encode()).hexdigest()[:16]
    if attempt is not None:
        pass
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        attempt = (
            f"{os.environ['TORCHELASTIC_RUN_ID']}/"
            f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        )
    else:  # one process outside torchrun (tests, benchmarks): each call is its own attempt
        attempt = f"pid-{os.getpid()}-{uuid.uuid4().hex}"
    run_dir = os.path.join(files.scratch_root(), "mds-cache", run)
    return os.path.join(run_dir, hashlib.sha256(attempt.encode()).hexdigest()[:12]), run_dir


def split_locations(url: str, cache_dir: str, split: str) -> tuple[str, str]:
    """(remote, local) for one split: the published folder or URL is always the *remote*.

    Read in place (``remote=None``), streaming would decompress ``.mds.zstd`` shards into the
    published folder itself, changing published data and failing on a read-only volume; so every
    split is copied (decompressed) into its own ``local`` cache sub-folder instead.
    """
    url = files.local_path(url)
    if "://" not in url and not Path(url, "index.json").exists():
        raise FileNotFoundError(f"{split} split: no MDS dataset (index.json) at {url}")
    return url, os.path.join(cache_dir, split)
