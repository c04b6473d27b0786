#!/usr/bin/env bash
# GPU smoke check: ggpo-train on every GPU of this machine, FSDP2 + bf16, a few steps,
# then tokens/s from the run's metrics. Builds its own model and data (no downloads).
#
#   bash benchmarks/gpu_smoke.sh                     # all GPUs (nvidia-smi -L)
#   STEPS=20 HIDDEN=1024 LAYERS=16 bash benchmarks/gpu_smoke.sh
#   ACCELERATOR=cpu DEVICES=2 PRECISION=32-true bash benchmarks/gpu_smoke.sh   # dry run without a GPU
#
# Prints the run's summary line and, per step, train tokens/s (learner + reference forward,
# backward, optimizer) and rollout tokens/s (summed over ranks), and the median of each
# after the first step. Exit status is ggpo-train's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ACCELERATOR=${ACCELERATOR:-gpu}
if [ -z "${DEVICES:-}" ]; then
    DEVICES=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [ "$DEVICES" -ge 1 ] || { echo "gpu_smoke: no GPU found (nvidia-smi -L); set ACCELERATOR=cpu DEVICES=2 for a dry run" >&2; exit 2; }
fi
PRECISION=${PRECISION:-bf16-mixed}
STEPS=${STEPS:-10}
HIDDEN=${HIDDEN:-512}
LAYERS=${LAYERS:-8}
HEADS=${HEADS:-8}
PROMPTS_PER_DEVICE=${PROMPTS_PER_DEVICE:-16}
WORK=${WORK:-$(mktemp -d /tmp/ggpo-gpu-smoke.XXXXXX)}
echo "gpu_smoke: $DEVICES x $ACCELERATOR, $PRECISION, ${HIDDEN}x${LAYERS} model, $STEPS steps, work dir $WORK"

HF_HUB_OFFLINE=1 "$PY" -m ggpo_lightning.train --config recipes/fsdp-cpu-2proc.yaml \
    --trainer.accelerator "$ACCELERATOR" --trainer.devices "$DEVICES" \
    --trainer.strategy.data_parallel_size "$DEVICES" --trainer.precision "$PRECISION" \
    --trainer.max_steps "$STEPS" --trainer.val_check_interval "$STEPS" --trainer.enable_progress_bar false \
    --trainer.logger.init_args.save_dir "$WORK/runs" --trainer.logger.init_args.name smoke \
    --checkpoint.every_n_train_steps "$STEPS" \
    --model.model_name_or_path "$WORK/model" --tiny_model.hidden_size "$HIDDEN" \
    --tiny_model.num_layers "$LAYERS" --tiny_model.num_heads "$HEADS" \
    --tiny_model.sft_steps 0 --model.rollout.sampling.max_new_tokens 32 --model.eval.max_new_tokens 8 \
    --data.train_path "$WORK/data/train.jsonl" --data.val_path "$WORK/data/test.jsonl" --data.val_size 64 \
    --data.prompts_per_step $((PROMPTS_PER_DEVICE * DEVICES))

"$PY" - "$WORK/runs/smoke/version_0/metrics.csv" <<'PYEOF'
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("train/train_tokens_per_s")]
train = [float(r["train/train_tokens_per_s"]) for r in rows]
rollout = [float(r["train/rollout_tokens_per_s"]) for r in csv.DictReader(open(sys.argv[1]))
           if r.get("train/rollout_tokens_per_s")]
for step, (t, g) in enumerate(zip(train, rollout)):
    print(f"step {step:3d}  train {t:10.0f} tok/s (rank 0)   rollout {g:10.0f} tok/s (all ranks)")
print(f"median after step 0: train {statistics.median(train[1:] or train):.0f} tok/s (rank 0), "
      f"rollout {statistics.median(rollout[1:] or rollout):.0f} tok/s (all ranks)")
PYEOF
