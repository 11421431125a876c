#!/usr/bin/env bash
# The GPU check in one command, on the GPU machine's image as shipped (nothing to download there):
#   benchmarks/gpu/run.sh                 # on the GPU: results/gpu_smoke.json (and $OUT/)
#   benchmarks/gpu/run.sh --cpu-check     # the same script on CPU: tiny model, fp32
# First, here: benchmarks/gpu/prepare.sh (wheels + tokenizer into benchmarks/gpu/carry/, which the
# device call carries). The wheels are installed into a temporary folder put first on PYTHONPATH;
# the repository itself is imported from the checkout (no install). PYTHON picks the interpreter
# (default python3, the image's).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
carry="$repo/benchmarks/gpu/carry"
python=${PYTHON:-python3}
tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
if [ ! -d "$carry/wheels/$tag" ] || [ ! -f "$carry/tokenizer/vocab.txt" ]; then
  echo "missing $carry/wheels/$tag or $carry/tokenizer: run benchmarks/gpu/prepare.sh" \
    "${tag:2:1}.${tag:3} here first, and carry benchmarks/gpu/carry" >&2
  exit 2
fi
site=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")
trap 'rm -rf "$site"' EXIT
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
  "$carry/wheels/$tag"/*.whl
export PYTHONPATH="$site:$repo"
"$python" "$repo/benchmarks/gpu/smoke.py" --tokenizer "$carry/tokenizer" "$@"
