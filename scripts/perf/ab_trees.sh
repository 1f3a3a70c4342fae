#!/bin/bash
# A/B of `python -m dspark.worker.bench_spec` between a commit and the working
# tree, alternating (before, after, before, after), on the same machine state.
#
#   scripts/perf/ab_trees.sh REV [bench_spec args...]
#   e.g. scripts/perf/ab_trees.sh c58ad5b --conc 1 --prompts 4 --max-tokens 128 \
#            --rounds 2 --threads 2 --verify fixed
#
# REV is checked out into a worktree under $TMPDIR and imported through
# PYTHONPATH as the `dspark` package (its services mapped like pyproject's
# package-dir, this tree's generated stubs), with this checkout's .venv; its
# native kernels are built for its own sources where they are not yet (each
# source set has its own build in the cache). Prints each run's summary lines,
# prefixed before1 / after1 / ...
set -euo pipefail
rev=${1:?usage: ab_trees.sh REV [bench_spec args...]}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
py=$root/.venv/bin/python
tmp=${TMPDIR:-/tmp}/dspark-ab-$(git -C "$root" rev-parse --short "$rev")
if [ ! -d "$tmp/tree" ]; then
  git -C "$root" worktree add -f --detach "$tmp/tree" "$rev" >/dev/null
fi
pkg=$tmp/pkg/dspark
mkdir -p "$pkg"
cp "$root/gen/dspark/__init__.py" "$pkg/"
ln -sfn "$root/gen/dspark/v1" "$pkg/v1"
for m in router scheduler worker; do ln -sfn "$tmp/tree/services/$m" "$pkg/$m"; done
ln -sfn "$tmp/tree/shared" "$pkg/shared"
# the design docs and datasets sit beside the checkout
[ -e "$tmp/shared" ] || ln -sfn "$root/../shared" "$tmp/shared"
(cd "$tmp/tree" && PYTHONPATH=$tmp/pkg "$py" -m dspark.worker.model.native_attention >/dev/null)
summary() { grep -E "^(batch|[0-9]+ concurrent|k0|k7)" | sed "s/^/$1: /"; }
for i in 1 2; do
  (cd "$tmp/tree" && PYTHONPATH=$tmp/pkg "$py" -m dspark.worker.bench_spec "$@" 2>&1 | summary "before$i")
  (cd "$root" && "$py" -m dspark.worker.bench_spec "$@" 2>&1 | summary "after$i")
done
