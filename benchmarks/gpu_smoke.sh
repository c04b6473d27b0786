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
# MODE=async generates in the producer thread while the learner trains (one trainer process).
#
# Prints the run's summary line and, per step, train tokens/s (learner + reference forward,
# backward, optimizer) and rollout tokens/s (summed over ranks), and the median of each
# after the first step; on GPUs the peak memory in use per GPU (nvidia-smi, every 0.5 s:
# learner, reference, optimizer and the vLLM engine together); with ENGINE=vllm how often
# vLLM slept (its "Sleep mode freed" lines) and the engine's weight syncs; on GPUs the peak of
# torch.cuda.max_memory_allocated (rank 0; train/peak_memory_gb) beside the memory estimate ggpo-train
# printed before the weights load (vLLM's share counts in the estimate and in nvidia-smi's figure).
#
# The vLLM-server engine (model.rollout.engine: vllm_server, docs/PERFORMANCE.md "vLLM servers (issue 41)"),
# before the run, capped at SERVERS_TIMEOUT seconds (default 120), skipped with SKIP_SERVERS=1; without vLLM:
# `ggpo-train --config recipes/qwen3-1.7b-math.yaml --model.rollout.engine vllm_server --model.rollout.servers
# local:1 --print_config` prints the recipe, and the same run (no --print_config) stops in its preflight with one
# line naming the missing vLLM, exit 2. Where vLLM is installed (`$PY -c 'import vllm'`), after the run instead,
# capped at SERVERS_RUN_TIMEOUT seconds (default 420): `ggpo serve` of the run's model on GPU 0 (nccl weight
# transfer, gpu_memory_utilization 0.3), then SERVER_STEPS (default 3) steps of ggpo-train on one device
# generating on it (weights pushed over nccl at every step), then the server is stopped.
# A torch.profiler capture of one HF-engine rollout (benchmarks/decode_loop.py --profile: PROFILE_ROWS rows, default
# 256, of the run's model shape with random weights, PROFILE_TOKENS new tokens, default 64: the steps are alike, and
# a trace of a thousand grows to gigabytes; on GPU 0 in fp32, the engine's default) after the run, capped at
# PROFILE_TIMEOUT seconds (default 300), skipped with SKIP_PROFILE=1: $WORK/decode_profile/trace.json (chrome
# trace) and key_averages.txt, and the seconds per decoding step in $WORK/decode_profile.json.
# The first weight push's order (tests/training/test_rollout_loop.py, its GPU case: pushed tensors on the learner's GPU,
# after the strategy's setup, once on resume), capped at PUSH_ORDER_TIMEOUT seconds (default 180), skipped with
# SKIP_PUSH_ORDER=1.
# The weight push's wire on GPUs (issue 56; benchmarks/nccl_push.py, no vLLM needed): Qwen3-1.7B's state dict in
# bf16 (151936-token vocabulary) packed into 128 MiB buckets and broadcast over NCCL from GPU 0 to GPU 1, bucket i+1
# packed while bucket i is in flight; the seconds, GB/s and the packing's alone (on one GPU the packing only: NCCL
# cannot join two processes on one GPU). Capped at NCCL_PUSH_TIMEOUT seconds (default 180), skipped with
# SKIP_NCCL_PUSH=1 and without a GPU; NCCL_PUSH_ARGS adds flags (e.g. "--bucket-mib 512").
# Exit status is ggpo-train's; 3 when it succeeded but a servers check failed, 4 when the profile failed, 5 when the
# push order failed, 6 when the NCCL push failed.
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
SKIP_SERVERS=${SKIP_SERVERS:-0}
SERVERS_TIMEOUT=${SERVERS_TIMEOUT:-120}
SERVERS_RUN_TIMEOUT=${SERVERS_RUN_TIMEOUT:-420}
SERVER_STEPS=${SERVER_STEPS:-3}
SKIP_PROFILE=${SKIP_PROFILE:-0}
PROFILE_TIMEOUT=${PROFILE_TIMEOUT:-300}
SKIP_PUSH_ORDER=${SKIP_PUSH_ORDER:-0}
PUSH_ORDER_TIMEOUT=${PUSH_ORDER_TIMEOUT:-180}
PROFILE_ROWS=${PROFILE_ROWS:-256}
PROFILE_TOKENS=${PROFILE_TOKENS:-64}
MODE=${MODE:-sync}
PROMPTS_PER_DEVICE=${PROMPTS_PER_DEVICE:-16}
WORK=${WORK:-$(mktemp -d /tmp/ggpo-gpu-smoke.XXXXXX)}
mkdir -p "$WORK"
EXTRA=${EXTRA:-}  # more ggpo-train arguments, split on spaces (e.g. EXTRA="--model.rollout.dtype bfloat16")
echo "gpu_smoke: $DEVICES x $ACCELERATOR, $PRECISION, engine $ENGINE," \
     "$MODE rollouts, ${HIDDEN}x${LAYERS} model, $STEPS steps, <= $MAX_NEW_TOKENS new tokens, work dir $WORK"

engine_args=()
if [ "$ENGINE" = vllm ]; then
    engine_args=(--model.rollout.engine vllm --model.rollout.dtype bfloat16 --model.rollout.sync_every "$SYNC_EVERY"
                 --model.rollout.vllm_args "{\"max_model_len\": $POSITIONS}")
elif [ "$ENGINE" != hf ]; then
    echo "gpu_smoke: unknown ENGINE=$ENGINE (hf or vllm)" >&2; exit 2
fi
memory_poll=
if [ "$ACCELERATOR" = gpu ]; then  # peak memory in use per GPU, whoever holds it (vLLM allocates outside torch)
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > "$WORK/gpu_memory.csv" &
    memory_poll=$!
    trap 'kill "$memory_poll" 2>/dev/null || true' EXIT
fi

# the run's ggpo-train arguments less the engine's (the servers check below runs them with its own engine)
run_args=(--config recipes/fsdp-cpu-2proc.yaml
    --trainer.accelerator "$ACCELERATOR" --trainer.devices "$DEVICES"
    --trainer.strategy.data_parallel_size "$DEVICES" --trainer.precision "$PRECISION"
    --trainer.max_steps "$STEPS" --trainer.val_check_interval "$STEPS" --trainer.enable_progress_bar false
    --trainer.logger.init_args.save_dir "$WORK/runs" --trainer.logger.init_args.name smoke
    --checkpoint.every_n_train_steps "$STEPS"
    --model.model_name_or_path "$WORK/model" --tiny_model.hidden_size "$HIDDEN"
    --tiny_model.num_layers "$LAYERS" --tiny_model.num_heads "$HEADS" --tiny_model.num_kv_heads "$KV_HEADS"
    --tiny_model.intermediate_size "$INTERMEDIATE" --tiny_model.max_position_embeddings "$POSITIONS"
    --tiny_model.sft_steps 0 --model.rollout.sampling.max_new_tokens "$MAX_NEW_TOKENS" --model.eval.max_new_tokens 8
    --model.verifier_health.max_zero_reward_steps null
    --model.gradient_checkpointing "$GRADIENT_CHECKPOINTING"
    --data.train_path "$WORK/data/train.jsonl" --data.val_path "$WORK/data/test.jsonl" --data.val_size 64
    --synthetic_data.seed 0
    --data.prompts_per_step $((PROMPTS_PER_DEVICE * DEVICES)) --model.rollout.schedule "$MODE"
    ${MICRO_TOKENS:+--model.micro_batch.max_tokens "$MICRO_TOKENS"})

servers_failed=0
servers_fail() { echo "gpu_smoke: servers check FAILED: $*" >&2; servers_failed=1; }
has_vllm=0
"$PY" -c 'import vllm' 2>/dev/null && has_vllm=1
server_recipe=(--config recipes/qwen3-1.7b-math.yaml --model.rollout.engine vllm_server
               --model.rollout.servers local:1 --trainer.accelerator "$ACCELERATOR" --trainer.devices 1)
if [ "$SKIP_SERVERS" != 1 ]; then  # what runs without vLLM: the recipe prints, the preflight names the missing vLLM
    echo "gpu_smoke: servers check (vLLM $([ $has_vllm = 1 ] && echo installed || echo 'not installed'))," \
         "${SERVERS_TIMEOUT}s cap"
    set +e
    HF_HUB_OFFLINE=1 timeout "$SERVERS_TIMEOUT" "$PY" -m ggpo_lightning.cli.train "${server_recipe[@]}" --print_config \
        > "$WORK/servers_print_config.txt" 2>&1
    code=$?
    set -e
    if [ "$code" -eq 0 ] && grep -q 'engine: vllm_server' "$WORK/servers_print_config.txt" \
            && grep -q 'servers: local:1' "$WORK/servers_print_config.txt"; then
        echo "  --print_config with engine vllm_server, servers local:1: ok"
    else
        servers_fail "--print_config exit $code: $(tail -n 2 "$WORK/servers_print_config.txt")"
    fi
    if [ "$has_vllm" = 0 ]; then
        set +e
        HF_HUB_OFFLINE=1 timeout "$SERVERS_TIMEOUT" "$PY" -m ggpo_lightning.cli.train "${server_recipe[@]}" \
            > "$WORK/servers_preflight.txt" 2>&1
        code=$?
        set -e
        line=$(grep -m 1 'needs vLLM, which is not installed' "$WORK/servers_preflight.txt" || true)
        if [ "$code" -eq 2 ] && [ -n "$line" ] && [ "$(grep -c '^ggpo-train: error' "$WORK/servers_preflight.txt")" -eq 1 ]; then
            echo "  preflight without vLLM: exit 2, one line: ${line:0:120}..."
        else
            servers_fail "preflight exit $code (expected 2 and one line naming the missing vLLM):" \
                         "$(tail -n 3 "$WORK/servers_preflight.txt")"
        fi
    fi
fi

set +e  # report memory and sleeps also when the run fails (e.g. out of memory)
HF_HUB_OFFLINE=1 "$PY" -m ggpo_lightning.cli.train "${run_args[@]}" "${engine_args[@]}" $EXTRA \
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

# where vLLM is installed: a `ggpo serve` of the run's model, and a short run generating on it (nccl on GPUs)
if [ "$SKIP_SERVERS" != 1 ] && [ "$has_vllm" = 1 ]; then
    port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    deadline=$((SECONDS + SERVERS_RUN_TIMEOUT))
    echo "gpu_smoke: ggpo serve $WORK/model on port $port and $SERVER_STEPS steps generating on it," \
         "${SERVERS_RUN_TIMEOUT}s cap; server log $WORK/serve.log"
    gpu_share=()
    [ "$ACCELERATOR" != gpu ] || gpu_share=(--gpu-memory-utilization 0.3)  # beside the trainer on GPU 0
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} HF_HUB_OFFLINE=1 timeout "$SERVERS_RUN_TIMEOUT" \
        "$PY" -c 'import sys; from ggpo_lightning.cli.main import main; sys.exit(main(prog_name="ggpo"))' \
        serve "$WORK/model" --port "$port" --dtype bfloat16 \
        -- --max-model-len "$POSITIONS" "${gpu_share[@]}" > "$WORK/serve.log" 2>&1 &
    serve_pid=$!
    trap 'kill "$memory_poll" 2>/dev/null || true; kill -INT "$serve_pid" 2>/dev/null || true' EXIT
    until grep -q "^ggpo serve: http://" "$WORK/serve.log" 2>/dev/null; do
        if ! kill -0 "$serve_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then break; fi
        sleep 2
    done
    if grep -q "^ggpo serve: http://" "$WORK/serve.log"; then
        echo "  $(grep -m 1 '^ggpo serve: http://' "$WORK/serve.log") (after $((SECONDS + SERVERS_RUN_TIMEOUT - deadline)) s)"
        set +e
        HF_HUB_OFFLINE=1 timeout $((deadline - SECONDS > 10 ? deadline - SECONDS : 10)) \
            "$PY" -m ggpo_lightning.cli.train "${run_args[@]}" --trainer.devices 1 \
            --trainer.strategy.data_parallel_size 1 --trainer.max_steps "$SERVER_STEPS" \
            --trainer.val_check_interval "$SERVER_STEPS" --checkpoint.every_n_train_steps "$SERVER_STEPS" \
            --trainer.logger.init_args.name servers --data.prompts_per_step "$PROMPTS_PER_DEVICE" \
            --model.rollout.schedule sync --model.rollout.engine vllm_server --model.rollout.dtype bfloat16 \
            --model.rollout.servers "[\"http://127.0.0.1:$port\"]" $EXTRA > "$WORK/servers_train.log" 2>&1
        code=$?
        set -e
        if [ "$code" -eq 0 ]; then
            "$PY" - "$WORK/runs/servers/version_0/metrics.csv" <<'PYEOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
push = [float(r["train/weight_push_seconds"]) for r in rows if r.get("train/weight_push_seconds")]
rollout = [float(r["train/rollout_tokens_per_s"]) for r in rows if r.get("train/rollout_tokens_per_s")]
print(f"  {len(rollout)} steps on the server: rollout tok/s {[round(x) for x in rollout]}, "
      f"weight push s per step {[round(x, 3) for x in push]}")
PYEOF
        else
            servers_fail "the run on the server exited $code: $(tail -n 3 "$WORK/servers_train.log")"
        fi
    else
        servers_fail "ggpo serve did not come up within the cap: $(tail -n 3 "$WORK/serve.log")"
    fi
    kill -INT "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
fi
# the first weight push's order (issue 54): once the strategy placed the learner on its GPU, and once on resume; the
# test's GPU case must pass, not skip
push_order_failed=0
if [ "$SKIP_PUSH_ORDER" != 1 ]; then
    set +e
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} HF_HUB_OFFLINE=1 timeout "$PUSH_ORDER_TIMEOUT" "$PY" -m pytest -q \
        -p no:cacheprovider tests/training/test_rollout_loop.py -k "first_push and $ACCELERATOR" > "$WORK/push_order.log" 2>&1
    code=$?
    set -e
    if [ "$code" -eq 0 ] && grep -q "^1 passed" "$WORK/push_order.log"; then
        echo "gpu_smoke: first push after the strategy placed the learner on $ACCELERATOR, once on resume: passed"
    else
        echo "gpu_smoke: first push order FAILED (exit $code): $(tail -n 3 "$WORK/push_order.log")" >&2
        push_order_failed=1
    fi
fi
# one rollout of the HF engine's decoding loop under torch.profiler (where its time per token goes)
profile_failed=0
if [ "$SKIP_PROFILE" != 1 ]; then
    echo "gpu_smoke: torch.profiler over one HF rollout ($PROFILE_ROWS rows, <= $PROFILE_TOKENS tokens)," \
         "${PROFILE_TIMEOUT}s cap; $WORK/decode_profile/"
    profile_device=cpu
    [ "$ACCELERATOR" != gpu ] || profile_device=cuda
    set +e
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} HF_HUB_OFFLINE=1 timeout "$PROFILE_TIMEOUT" \
        "$PY" benchmarks/decode_loop.py --like "$WORK/model" --device "$profile_device" --rows "$PROFILE_ROWS" \
        --max-new-tokens "$PROFILE_TOKENS" --rounds 1 --threads "$(nproc)" --profile "$WORK/decode_profile" \
        > "$WORK/decode_profile.json" 2> "$WORK/decode_profile.log"
    code=$?
    set -e
    if [ "$code" -eq 0 ]; then
        grep -E '"(seconds_per_step|forward_seconds_per_step|outside_forward_seconds_per_step)"' \
            "$WORK/decode_profile.json" | sed 's/^/  /'
    else
        echo "gpu_smoke: profile FAILED (exit $code): $(tail -n 3 "$WORK/decode_profile.log")" >&2
        profile_failed=1
    fi
fi
# the weight push's wire over NCCL (issue 56): what a push to servers on other GPUs could reach, without vLLM
nccl_push_failed=0
if [ "${SKIP_NCCL_PUSH:-0}" != 1 ] && [ "$ACCELERATOR" = gpu ]; then
    set +e
    timeout "${NCCL_PUSH_TIMEOUT:-180}" "$PY" benchmarks/nccl_push.py ${NCCL_PUSH_ARGS:-} > "$WORK/nccl_push.log" 2>&1
    code=$?
    set -e
    if [ "$code" -eq 0 ]; then
        grep "^nccl_push:" "$WORK/nccl_push.log"
    else
        echo "gpu_smoke: NCCL push FAILED (exit $code): $(tail -n 3 "$WORK/nccl_push.log")" >&2
        nccl_push_failed=1
    fi
fi
[ "$servers_failed" = 0 ] || exit 3
[ "$profile_failed" = 0 ] || exit 4
[ "$push_order_failed" = 0 ] || exit 5
[ "$nccl_push_failed" = 0 ] || exit 6
