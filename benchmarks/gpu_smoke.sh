#!/usr/bin/env bash
# GPU smoke check: ggpo-train on every GPU of this machine, FSDP2 + bf16, a few steps,
# then tokens/s from the run's metrics. Builds its own model and data (no downloads).
#
#   bash benchmarks/gpu_smoke.sh                     # all GPUs (nvidia-smi -L)
#   STEPS=20 HIDDEN=1024 LAYERS=16 bash benchmarks/gpu_smoke.sh
#   ACCELERATOR=cpu DEVICES=2 PRECISION=32-true bash benchmarks/gpu_smoke.sh   # dry run without a GPU
#
# The vLLM colocated path (docs/PERFORMANCE.md, "What a GPU run must check"), in a venv with
# `pip install -e '.[vllm,lora]'`:
#   PY=.venv-gpu/bin/python ENGINE=vllm SHAPE=qwen3-1.7b DEVICES=1 bash benchmarks/gpu_smoke.sh
# ENGINE=vllm samples with a vLLM engine in each trainer process (rollouts in bf16, synced
# from the FSDP-gathered learner every SYNC_EVERY updates, sleeping between rollouts);
# SHAPE=qwen3-1.7b gives the model Qwen3-1.7B's decoder shape (28 layers, 2048 wide, 16
# query / 8 key-value heads of 128, MLP 6144), randomly initialised, with the tiny
# word-level vocabulary (so 1.41B parameters: no 151936-row embedding), and
# MAX_NEW_TOKENS=1024 (the paper's; a random model runs every response to the limit) in
# micro-batches of MICRO_TOKENS=32768 padded tokens (model.micro_batch.max_tokens; empty = one pass), and
# ENGINE=vllm by default, as the qwen3-1.7b-math recipe (ENGINE=hf is its fallback).
# PLACEMENT=separate runs that engine in a process of its own (model.rollout.vllm_placement),
# VLLM_DEVICE=1 on GPU 1 (model.rollout.vllm_devices; the trainer then uses DEVICES=1, GPU 0);
# MODE=async generates in the producer thread while the learner trains (one trainer process).
#
# Prints the run's summary line and, per step, train tokens/s (learner + reference forward,
# backward, optimizer) and rollout tokens/s (summed over ranks), and the median of each
# after the first step; on GPUs the peak memory in use per GPU (nvidia-smi, every 0.5 s:
# learner, reference, optimizer and the vLLM engine together); with ENGINE=vllm how often
# vLLM slept (its "Sleep mode freed" lines) and the engine's weight syncs; on GPUs the peak of
# torch.cuda.max_memory_allocated (rank 0; train/peak_memory_gb) beside the memory estimate ggpo-train
# printed before the weights load (vLLM's share counts in the estimate and in nvidia-smi's figure).
# Exit status is ggpo-train's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ACCELERATOR=${ACCELERATOR:-gpu}
MICRO_TOKENS=${MICRO_TOKENS:-}
SHAPE=${SHAPE:-}
if [ "$SHAPE" = qwen3-1.7b ]; then
    ENGINE=${ENGINE:-vllm}  # as the recipe
    HIDDEN=${HIDDEN:-2048} LAYERS=${LAYERS:-28} HEADS=${HEADS:-16} KV_HEADS=${KV_HEADS:-8}
    INTERMEDIATE=${INTERMEDIATE:-6144} MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-1024} PROMPTS_PER_DEVICE=${PROMPTS_PER_DEVICE:-32}
    MICRO_TOKENS=${MICRO_TOKENS:-32768}  # the paper's batch (32 x 8 x 1024 new tokens) in micro-batches
    GRADIENT_CHECKPOINTING=${GRADIENT_CHECKPOINTING:-true}  # as the qwen3-1.7b-math recipe
elif [ -n "$SHAPE" ]; then
    echo "gpu_smoke: unknown SHAPE=$SHAPE (known: qwen3-1.7b)" >&2; exit 2
fi
if [ -z "${DEVICES:-}" ]; then
    DEVICES=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [ "$DEVICES" -ge 1 ] || { echo "gpu_smoke: no GPU found (nvidia-smi -L); set ACCELERATOR=cpu DEVICES=2 for a dry run" >&2; exit 2; }
fi
ENGINE=${ENGINE:-hf}
PRECISION=${PRECISION:-bf16-mixed}
STEPS=${STEPS:-10}
HIDDEN=${HIDDEN:-512}
LAYERS=${LAYERS:-8}
HEADS=${HEADS:-8}
KV_HEADS=${KV_HEADS:-$HEADS}
INTERMEDIATE=${INTERMEDIATE:-$((4 * HIDDEN))}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-32}
POSITIONS=$((MAX_NEW_TOKENS + 64 > 128 ? MAX_NEW_TOKENS + 64 : 128))  # prompt + response
GRADIENT_CHECKPOINTING=${GRADIENT_CHECKPOINTING:-false}
SYNC_EVERY=${SYNC_EVERY:-4}
PLACEMENT=${PLACEMENT:-colocated}
VLLM_DEVICE=${VLLM_DEVICE:-}
MODE=${MODE:-sync}
PROMPTS_PER_DEVICE=${PROMPTS_PER_DEVICE:-16}
WORK=${WORK:-$(mktemp -d /tmp/ggpo-gpu-smoke.XXXXXX)}
mkdir -p "$WORK"
EXTRA=${EXTRA:-}  # more ggpo-train arguments, split on spaces (e.g. EXTRA="--model.rollout.dtype bfloat16")
echo "gpu_smoke: $DEVICES x $ACCELERATOR, $PRECISION, engine $ENGINE ($PLACEMENT${VLLM_DEVICE:+ on GPU $VLLM_DEVICE})," \
     "$MODE rollouts, ${HIDDEN}x${LAYERS} model, $STEPS steps, <= $MAX_NEW_TOKENS new tokens, work dir $WORK"

engine_args=()
if [ "$ENGINE" = vllm ]; then
    engine_args=(--model.rollout.engine vllm --model.rollout.dtype bfloat16 --model.rollout.sync_every "$SYNC_EVERY"
                 --model.rollout.vllm_args "{\"max_model_len\": $POSITIONS}" --model.rollout.vllm_placement "$PLACEMENT")
    [ -z "$VLLM_DEVICE" ] || engine_args+=(--model.rollout.vllm_devices "[$VLLM_DEVICE]")
elif [ "$ENGINE" != hf ]; then
    echo "gpu_smoke: unknown ENGINE=$ENGINE (hf or vllm)" >&2; exit 2
fi
memory_poll=
if [ "$ACCELERATOR" = gpu ]; then  # peak memory in use per GPU, whoever holds it (vLLM allocates outside torch)
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > "$WORK/gpu_memory.csv" &
    memory_poll=$!
    trap 'kill "$memory_poll" 2>/dev/null || true' EXIT
fi

set +e  # report memory and sleeps also when the run fails (e.g. out of memory)
HF_HUB_OFFLINE=1 "$PY" -m ggpo_lightning.cli.train --config recipes/fsdp-cpu-2proc.yaml \
    --trainer.accelerator "$ACCELERATOR" --trainer.devices "$DEVICES" \
    --trainer.strategy.data_parallel_size "$DEVICES" --trainer.precision "$PRECISION" \
    --trainer.max_steps "$STEPS" --trainer.val_check_interval "$STEPS" --trainer.enable_progress_bar false \
    --trainer.logger.init_args.save_dir "$WORK/runs" --trainer.logger.init_args.name smoke \
    --checkpoint.every_n_train_steps "$STEPS" \
    --model.model_name_or_path "$WORK/model" --tiny_model.hidden_size "$HIDDEN" \
    --tiny_model.num_layers "$LAYERS" --tiny_model.num_heads "$HEADS" --tiny_model.num_kv_heads "$KV_HEADS" \
    --tiny_model.intermediate_size "$INTERMEDIATE" --tiny_model.max_position_embeddings "$POSITIONS" \
    --tiny_model.sft_steps 0 --model.rollout.sampling.max_new_tokens "$MAX_NEW_TOKENS" --model.eval.max_new_tokens 8 \
    --model.verifier_health.max_zero_reward_steps null \
    --model.gradient_checkpointing "$GRADIENT_CHECKPOINTING" \
    --data.train_path "$WORK/data/train.jsonl" --data.val_path "$WORK/data/test.jsonl" --data.val_size 64 \
    --synthetic_data.seed 0 \
    --data.prompts_per_step $((PROMPTS_PER_DEVICE * DEVICES)) --model.rollout.schedule "$MODE" "${engine_args[@]}" \
    ${MICRO_TOKENS:+--model.micro_batch.max_tokens "$MICRO_TOKENS"} $EXTRA \
    2>&1 | tee "$WORK/train.log"
status=${PIPESTATUS[0]}
set -e
[ -z "$memory_poll" ] || kill "$memory_poll" 2>/dev/null || true
if [ -s "$WORK/gpu_memory.csv" ]; then
    awk -F', *' '{ if ($2 > peak[$1]) peak[$1] = $2 }
                 END { for (g in peak) printf "peak memory in use: GPU %s %.1f GiB\n", g, peak[g] / 1024 }' \
        "$WORK/gpu_memory.csv"
fi
if [ "$ENGINE" = vllm ]; then
    echo "vLLM slept $(grep -c 'Sleep mode freed' "$WORK/train.log" || true) times (after every rollout, where" \
         "its sleep mode is available); weight syncs: every $SYNC_EVERY updates"
fi
[ "$status" -eq 0 ] || exit "$status"

"$PY" - "$WORK/runs/smoke/version_0/metrics.csv" "$WORK/train.log" <<'PYEOF'
import csv, re, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r.get("train/train_tokens_per_s")]
train = [float(r["train/train_tokens_per_s"]) for r in rows]
rollout = [float(r["train/rollout_tokens_per_s"]) for r in csv.DictReader(open(sys.argv[1]))
           if r.get("train/rollout_tokens_per_s")]
for step, (t, g) in enumerate(zip(train, rollout)):
    print(f"step {step:3d}  train {t:10.0f} tok/s (rank 0)   rollout {g:10.0f} tok/s (all ranks)")
print(f"median after step 0: train {statistics.median(train[1:] or train):.0f} tok/s (rank 0), "
      f"rollout {statistics.median(rollout[1:] or rollout):.0f} tok/s (all ranks)")
lengths = [float(r["train/response_length"]) for r in csv.DictReader(open(sys.argv[1])) if r.get("train/response_length")]
cut = [float(r["train/truncated_share"]) for r in csv.DictReader(open(sys.argv[1])) if r.get("train/truncated_share")]
if lengths:
    print(f"responses: mean length {statistics.mean(lengths):.0f} tokens, truncated share {statistics.mean(cut):.2f}")
peaks = [float(r["train/peak_memory_gb"]) for r in csv.DictReader(open(sys.argv[1])) if r.get("train/peak_memory_gb")]
estimate = re.findall(r"^  total +([\d.]+) GB", open(sys.argv[2]).read(), re.MULTILINE)
if peaks:
    print(f"peak torch.cuda.max_memory_allocated: {max(peaks):.2f} GB (rank 0); the estimate printed at start: "
          f"{estimate[0] if estimate else '?'} GB per device")
PYEOF
