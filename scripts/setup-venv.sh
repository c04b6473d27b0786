#!/usr/bin/env bash
# Create (or update) the project's virtual environment and install the package
# with its dev extra. Used by `make test`, `make quickstart` and CI.
#
#   VENV=.venv           where the environment lives
#   PYTHON=python3       interpreter that creates it
#   TORCH_SPEC=...       torch requirement installed first (see below)
#
# torch: pyproject.toml asks for a range (GPU users need their CUDA build). On a
# machine without an NVIDIA GPU we install the CPU build first (torch==2.13.0 lies
# on this kind of machine's disk), so the range is already met and pip does not
# pull a multi-GB CUDA build. Override with TORCH_SPEC (and PIP_INDEX_URL / 
# PIP_EXTRA_INDEX_URL for the PyTorch wheel index) where that build is not at hand.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
stamp="$VENV/.ggpo-installed"

if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
    exit 0  # up to date
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
if ! command -v nvidia-smi >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
fi
"$VENV/bin/python" -m pip install --quiet -e ".[dev]"
touch "$stamp"
