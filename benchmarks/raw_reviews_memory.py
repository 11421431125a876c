"""raw_reviews' own memory on one big CSV, in-process and without Dagster: read + validate + write
(``assets.raw._stream_validated``) and the duplicate-conflict pass (``_resolve_conflicts``).

    .venv/bin/python benchmarks/raw_reviews_memory.py /tmp/i28big/work/one-file/reviews-100000.csv

The file: ``benchmarks/scale.py``'s ``make_one_file`` (the shared Arabic reviews copied, ``#k``
suffixes). ``RssAnon`` of this process is sampled every 20 ms (``peak``: the whole run,
``peak_stream``: before the conflict pass; ``base_mb``: after the imports). One JSON line, then
(rows read, anon MB, peak so far, pyarrow pool MB) at each source block: where a rise with the row
count would show. Unlike scale.py this leaves out what the Dagster step process imports (the code
location), so the figure is the path's own.
"""

import json
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import dagster  # noqa: F401 - what the asset's module imports anyway, counted in base_mb
import pyarrow as pa

from finetune_assets.core.prep.validate import StreamValidator, ValidationRules
from finetune_assets.core.sources import SourceSpec
from finetune_assets.defs.data import raw


def anon() -> float:
    for ln in open("/proc/self/status"):
        if ln.startswith("RssAnon:"):
            return int(ln.split()[1]) / 1024
    return 0.0


def main(src: str) -> None:
    peak, stop, log = [0.0], threading.Event(), []
    validator = StreamValidator(ValidationRules())

    def sampler():
        while not stop.is_set():
            peak[0] = max(peak[0], anon())
            time.sleep(0.02)

    def info(_message):
        mb = pa.total_allocated_bytes() / 2**20
        log.append((validator.rows_in, round(anon(), 1), round(peak[0], 1), round(mb, 1)))

    context = types.SimpleNamespace(log=types.SimpleNamespace(info=info, warning=info))
    base = anon()
    threading.Thread(target=sampler, daemon=True).start()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        raw._stream_validated(SourceSpec(uri=src), validator, Path(d), 16384, context)
        streamed = peak[0]
        raw._resolve_conflicts(validator, Path(d), 16384, context)
        validator.close()
    stop.set()
    print(
        json.dumps(
            {
                "src": src,
                "rows": validator.rows_in,
                "acc": validator.accepted,
                "rej": validator.rejected,
                "base_mb": round(base, 1),
                "peak_stream": round(streamed, 1),
                "peak": round(peak[0], 1),
                "end": round(anon(), 1),
                "s": round(time.time() - t0, 1),
                "pool": pa.default_memory_pool().backend_name,
            }
        )
    )
    for row in log[:: max(1, len(log) // 12)] + log[-1:]:
        print(row)


if __name__ == "__main__":
    main(sys.argv[1])
