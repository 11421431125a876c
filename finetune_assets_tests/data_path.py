"""The product's data path in one process, for tests and benchmarks: what ``tokenized_reviews``
and ``mds_shards`` run (``defs/data/tokenized.py``, ``defs/data/mds_shards.py``), minus Dagster,
the publish step and the fan-out's processes.

The slices are planned as the assets plan them and each slice worker runs through the workers'
own command line (``python -m finetune_assets.core.shards.slices work --spec URL``), called here
in-process: the same spec JSON, the same parts, the same merged MDS. Nothing here tokenizes or
writes shards itself; only the glue the assets do around the workers is repeated.

    tokenized, shards = prepare(accepted, packaged_model_dir(), tmp_path, max_length=128)
    tokenized.table()  # input_ids, length, full_length, label, split: raw_reviews' row order
    shards["train"].samples  # {root}/shards/train: one MDS dataset, as the trainer reads it

Imports stay inside the functions: the GPU check (``benchmarks/gpu/smoke.py``) writes its
synthetic splits with :func:`shard_tokens` on the GPU machine's image, which carries only what its
check needs.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

REVIEWS_ROW_GROUP = 16_384  # raw_reviews' default batch_rows: its reviews.parquet's row groups
WORK = "_work"  # the workers' inputs (spec, tokenizer), removed afterwards as the assets do


@dataclass(frozen=True)
class Tokenized:
    """One tokenized_reviews attempt: ``{url}/parts/{i:05d}.arrow`` (+ ``.json``), in row order."""

    url: str
    max_length: int
    parts: list[dict]  # the slice workers' stats, in part order

    @property
    def rows(self) -> int:
        return sum(p["rows"] for p in self.parts)

    def table(self, columns: list[str] | None = None) -> pa.Table:
        """The parts as one table (``contracts.read_tokens``, what readers of the asset use)."""
        from finetune_assets.core.io.contracts import read_tokens

        return read_tokens(self.url, columns=columns)

    def length_stats(self) -> dict[str, float]:
        """The asset's token-length statistics: the parts' histograms merged, then
        ``stats_from_histogram``.
        """
        import numpy as np

        from finetune_assets.core.prep.tokenize import stats_from_histogram

        width = max((len(p["length_histogram"]) for p in self.parts), default=0)
        hist = np.zeros(width, dtype=np.int64)
        for p in self.parts:
            hist[: len(p["length_histogram"])] += p["length_histogram"]
        return stats_from_histogram(hist, self.max_length)


def write_reviews(accepted: pa.Table, path: Path, row_group_rows: int = REVIEWS_ROW_GROUP) -> Path:
    """``accepted`` (text, label, split, ...) as raw_reviews stores it: zstd Parquet, one row group
    per ``row_group_rows`` (the unit tokenized_reviews slices by).
    """
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(accepted, path, row_group_size=row_group_rows, compression="zstd")
    return path


def _run_workers(spec_url: str, count: int) -> None:
    """Every index of a fan-out, one after the other, through the workers' command line."""
    from finetune_assets.core.shards import slices

    for index in range(count):
        code = slices.main(["work", "--spec", spec_url, "--index", str(index)])
        if code:
            raise RuntimeError(f"slice worker {index} of {spec_url} exited {code}")


def tokenize(
    reviews: pa.Table | str | Path,
    model_dir: str | Path,
    out: Path,
    max_length: int = 512,
    *,
    labels=None,
    workers: int = 1,
    slice_rows: int = 65_536,
    batch_size: int = 2048,
    cache: str | None = None,
    row_group_rows: int = REVIEWS_ROW_GROUP,
) -> Tokenized:
    """tokenized_reviews into ``out``: ``reviews`` (a ``reviews.parquet`` of raw_reviews, or a table
    written as one first) tokenized by the base model in ``model_dir`` with the version's
    ``labels`` (default: the default label set), planned for ``workers`` workers.
    ``max_length`` is capped by what the model takes, as the asset caps it.
    """
    import pyarrow.parquet as pq

    from finetune_assets.core.labels.infer import DEFAULT_LABEL_SET
    from finetune_assets.core.prep.pretrained import load_tokenization
    from finetune_assets.core.prep.token_cache import TokenCache
    from finetune_assets.core.prep.tokenize import token_dtype
    from finetune_assets.core.shards import slices

    labels = DEFAULT_LABEL_SET if labels is None else labels
    out = Path(out)
    work = out / WORK
    work.mkdir(parents=True, exist_ok=True)
    if isinstance(reviews, pa.Table):
        reviews = write_reviews(reviews, work / "reviews.parquet", row_group_rows)
    tokenization = load_tokenization(str(model_dir))
    max_length = min(max_length, tokenization.max_input_tokens)
    meta = pq.ParquetFile(reviews).metadata
    plan = slices.plan_slices(
        [meta.row_group(i).num_rows for i in range(meta.num_row_groups)], workers, slice_rows
    )
    (work / "tokenizer.json").write_text(tokenization.tokenizer_json, encoding="utf-8")
    spec = slices.TokenizeSpec(
        reviews=str(reviews),
        out=str(out),
        slices=plan,
        tokenizer=str(work / "tokenizer.json"),
        dtype=token_dtype(tokenization.vocab_size).name,
        max_length=max_length,
        labels=labels.to_dict(),
        batch_size=batch_size,
        cache=cache,
        groups=slices.group_parts(len(plan), workers),
    )
    slices.write_spec(str(work / "spec.json"), spec)
    _run_workers(str(work / "spec.json"), spec.count)
    parts = slices.read_part_stats(str(out), len(plan))
    shutil.rmtree(work)
    if cache is not None:  # the asset indexes the new segments for the next version
        TokenCache(cache).compact()
    return Tokenized(url=str(out), max_length=max_length, parts=parts)


def shard(tokenized: Tokenized, out: Path, *, size_limit: int | str = "64mb", workers: int = 1):
    """mds_shards into ``out`` from a tokenized_reviews attempt: one MDS sub-dataset per part and
    split, merged into ``{out}/{split}/index.json``, each split read back as the asset reads it
    back on a local root. Returns ``{split: SplitShards}``, the asset's numbers.
    """
    from finetune_assets.core.shards import slices
    from finetune_assets.core.shards.mds import SplitShards, read_back_count

    out = Path(out)
    work = out / WORK
    work.mkdir(parents=True, exist_ok=True)
    count = len(tokenized.parts)
    spec = slices.ShardsSpec(
        tokens=tokenized.url,
        out=str(out),
        groups=slices.group_parts(count, workers, tokenized.rows),
        size_limit=size_limit,
    )
    slices.write_spec(str(work / "spec.json"), spec)
    _run_workers(str(work / "spec.json"), spec.count)
    shutil.rmtree(work)
    merged = slices.merge_shards(str(out), out, count)
    results = {s: SplitShards(split=s, **m) for s, m in merged.items()}
    for split, r in results.items():
        seen = read_back_count(out / split)
        if seen != r.samples:
            raise AssertionError(f"{out / split}: wrote {r.samples} samples, read back {seen}")
    return results


def shard_tokens(table: pa.Table, out: Path, *, size_limit: int | str = "64mb"):
    """mds_shards of token rows a test or benchmark makes up (``input_ids``, ``label``,
    ``split``): written as one tokenized_reviews part first (``token_batch``: the tokenize
    worker's columns), then :func:`shard`. The part goes to ``{out}-tokens``.
    """
    import numpy as np
    import pyarrow.compute as pc

    from finetune_assets.core.io.contracts import TOKEN_PARTS_DIR
    from finetune_assets.core.prep.tokenize import token_batch
    from finetune_assets.core.shards.plan import part_name

    ids = table.column("input_ids").combine_chunks()
    dtype = np.dtype(ids.type.value_type.to_pandas_dtype())
    lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False)
    labels = table.column("label").to_numpy()
    batch = token_batch(ids, lengths, labels, table.column("split").combine_chunks(), dtype)
    tokens = Path(out).with_name(f"{Path(out).name}-tokens")
    (tokens / TOKEN_PARTS_DIR).mkdir(parents=True, exist_ok=True)
    with pa.ipc.new_file(
        str(tokens / TOKEN_PARTS_DIR / f"{part_name(0)}.arrow"), batch.schema
    ) as f:
        f.write_batch(batch)
    # the one part's stats as far as the shard step reads them
    tokenized = Tokenized(str(tokens), int(lengths.max(initial=0)), [{"rows": table.num_rows}])
    return shard(tokenized, out, size_limit=size_limit)


def prepare(
    accepted: pa.Table,
    model_dir: str | Path,
    root: Path,
    max_length: int = 512,
    *,
    labels=None,
    size_limit: int | str = "64mb",
    workers: int = 1,
    **tokenize_options,
) -> tuple[Tokenized, dict]:
    """raw_reviews' accepted rows -> ``{root}/tokens`` (tokenized_reviews) -> ``{root}/shards``
    (mds_shards, one folder per split, what the trainer's ``data`` URLs name).
    """
    root = Path(root)
    tokenized = tokenize(
        accepted,
        model_dir,
        root / "tokens",
        max_length,
        labels=labels,
        workers=workers,
        **tokenize_options,
    )
    return tokenized, shard(tokenized, root / "shards", size_limit=size_limit, workers=workers)
