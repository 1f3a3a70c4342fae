#!/usr/bin/env bash
# Stage, on this machine, what a lent GPU machine (the workplace's `device` tool)
# needs to run the drafter recipe there: nothing can be fetched on it and each
# call carries at most 64 MiB with the working tree (~26 MB), so
#   .gpu/p0 .. .gpu/pN   the default model's GGUF in 32 MiB parts, one per call
#   .gpu/whl             the one wheel it lacks (gguf, pure Python)
#   .gpu/datasets        ../shared/datasets (it does not travel by itself)
# plus gen/ (the protobuf stubs, built by `make stubs`). .gpu/ is git-ignored
# locally (.git/info/exclude). See docs/DRAFTER.md, "On a lent GPU".
set -euo pipefail
cd "$(dirname "$0")/../.."
VPY=${VPY:-.venv/bin/python}
PART_MB=${PART_MB:-32}
test -d gen/dspark || { echo "prepare.sh: gen/ is missing: run make stubs" >&2; exit 1; }
gguf=$($VPY -c "from dspark.worker.convert import find_gguf; print(find_gguf(progress=False))")
rm -rf .gpu && mkdir -p .gpu/whl
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
split -b "${PART_MB}M" -d -a 1 "$gguf" .gpu/gguf.part-
n=0
for p in .gpu/gguf.part-*; do
  mkdir -p ".gpu/p$n" && mv "$p" ".gpu/p$n/"
  n=$((n + 1))
done
sha256sum "$gguf" | cut -d' ' -f1 > .gpu/whl/model.sha256
echo "$n" > .gpu/whl/model.parts
ver=$($VPY -c "import importlib.metadata as m; print(m.version('gguf'))")
$VPY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation py --abi none --platform any -d .gpu/whl "gguf==$ver"
cp -r ../shared/datasets .gpu/datasets
du -sh .gpu/* gen
echo "staged $n model parts: carry .gpu/p0 .. .gpu/p$((n - 1)) one per call (stage step), then"
echo ".gpu/p$((n - 1)) .gpu/whl .gpu/datasets gen with the run step (docs/DRAFTER.md)"
