#!/usr/bin/env bash
# The checks of benchmarks/gpu_smoke.sh that fit one short lease of a one-GPU machine, in one command,
# each under its own time cap inside a total deadline, logs under $OUT (default ./gpu_lease_out):
#   1. the default smoke: FSDP2 + bf16-mixed, HF engine, 512x8 model, 10 steps (sync rollouts)
#   2. SHAPE=qwen3-1.7b with the HF engine: the 1.41B Qwen3-1.7B-shaped model at the paper's batch
#      (32 prompts x 8 responses x 1024 new tokens, micro-batches of 32768 tokens, gradient checkpointing)
#   3. MODE=async: the default smoke with rollouts in the producer thread
# The first also runs gpu_smoke.sh's servers check (without vLLM: the vllm_server recipe prints, its preflight
# names the missing vLLM; under SERVERS_TIMEOUT) and its NCCL push check (the push's wire, benchmarks/nccl_push.py);
# the others skip both (SKIP_SERVERS=1 SKIP_NCCL_PUSH=1).
# For a machine whose Python has torch, lightning and transformers but not the rest (no package index
# there): build the wheels here first, carry `.whl`, and this script installs them into /tmp/site:
#   python -m pip wheel --no-deps --no-build-isolation . -w .whl
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#       jsonargparse==4.53.0 docstring_parser typeshed_client math-verify latex2sympy2_extended antlr4-python3-runtime==4.13.2
# vLLM (ENGINE=vllm) is not among them: its wheel is far over what a lease carries.
#   DEADLINE=560 QWEN_STEPS=3 bash benchmarks/gpu_lease.sh
#   CHECKS=qwen3 QWEN_CAP=300 QWEN_EXTRA='--model.rollout.dtype bfloat16' bash benchmarks/gpu_lease.sh
# CHECKS (smoke qwen3 async), SMOKE_STEPS/SMOKE_CAP, QWEN_STEPS/QWEN_CAP/QWEN_EXTRA, WORK_ROOT (/tmp: each check
# works in WORK_ROOT/lease-NAME); gpu_smoke.sh's own variables (ACCELERATOR, DEVICES, PRECISION, ...) pass through.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
DEADLINE=${DEADLINE:-560}  # seconds from start; each check gets min(its cap, what is left)
OUT=${OUT:-$PWD/gpu_lease_out}
WORK_ROOT=${WORK_ROOT:-/tmp}  # each check's work folder: $WORK_ROOT/lease-NAME
mkdir -p "$OUT"
export PY=${PY:-python3} PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_lease: installing .whl failed" >&2; exit 2; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
    date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; free -g | head -2
    "$PY" -c "import torch, lightning, transformers, jsonargparse, math_verify, ggpo_verifiers
print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0))
print('lightning', lightning.__version__, 'transformers', transformers.__version__, 'jsonargparse', jsonargparse.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

check() {  # check NAME CAP_SECONDS ENV=VALUE...
    local name=$1 cap=$2; shift 2
    local left=$((DEADLINE - ($(date +%s) - START)))
    [ "$left" -lt "$cap" ] && cap=$left
    if [ "$cap" -lt 30 ]; then echo "== $name: skipped (${left}s left)" | tee -a "$OUT/summary.txt"; return; fi
    echo "== $name (cap ${cap}s): $*" | tee -a "$OUT/summary.txt"
    local t0; t0=$(date +%s)
    env "$@" WORK="$WORK_ROOT/lease-$name" timeout -k 10 "$cap" bash benchmarks/gpu_smoke.sh 2>&1 \
        | while IFS= read -r line; do printf '%(%H:%M:%S)T %s\n' -1 "$line"; done > "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $(($(date +%s) - t0))s" | tee -a "$OUT/summary.txt"
    sed 's/^[0-9:]* //' "$OUT/$name.log" \
        | grep -E "^(step |median|responses|peak|vLLM slept|  total|summary written|gpu_smoke: servers|nccl_push:|  --print_config|  preflight|  ggpo serve|  [0-9]+ steps on the server)|Error|error:" \
        | tail -40 | tee -a "$OUT/summary.txt"
    cp "$WORK_ROOT/lease-$name/runs/smoke/version_0/metrics.csv" "$OUT/$name-metrics.csv" 2>/dev/null || true
}

for name in ${CHECKS:-smoke qwen3 async}; do
    case $name in
        smoke) check smoke "${SMOKE_CAP:-110}" STEPS="${SMOKE_STEPS:-10}" ;;
        qwen3) check qwen3 "${QWEN_CAP:-330}" SHAPE=qwen3-1.7b ENGINE=hf STEPS="${QWEN_STEPS:-3}" EXTRA="${QWEN_EXTRA:-}" \
               SKIP_SERVERS=1 SKIP_NCCL_PUSH=1 ;;
        async) check async 90 MODE=async STEPS=8 SKIP_SERVERS=1 SKIP_NCCL_PUSH=1 ;;
        *) echo "gpu_lease: unknown check $name (smoke, qwen3, async)" >&2; exit 2 ;;
    esac
done
