#!/usr/bin/env bash
# Here: a fresh virtualenv holding only the GPU image's packages (image-packages.txt, with their
# dependencies from PyPI), so `PYTHON=$VENV/bin/python benchmarks/gpu/run.sh --cpu-check` proves
# the check starts with nothing but the image and the carried wheels. Python 3.12 is the image's;
# this machine has only 3.11 (override with PYTHON_FOR_VENV). Several GB (torch's CUDA libraries).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${1:-$here/../../.gpu-check-venv}
rm -rf "$venv"
"${PYTHON_FOR_VENV:-python3}" -m venv "$venv"
"$venv/bin/pip" install -q --only-binary=:all: -r "$here/image-packages.txt"
# pip pulls these in as dependencies of others (typer here); the image has none of them: the
# check must get them from the carried wheels, as it does there.
"$venv/bin/pip" uninstall -q -y pydantic pydantic-core annotated-types typing-inspection \
  mosaicml-streaming zstd brotli python-snappy cramjam catalogue mlflow dagster 2>/dev/null || true
"$venv/bin/python" -c 'import pydantic' 2>/dev/null && { echo "pydantic still in $venv" >&2; exit 1; }
echo "image venv: $venv ($("$venv/bin/python" --version))"
