#!/usr/bin/env bash
# Create (or update) the project's virtual environment and install the package
# with the extras a command needs. Used by `make test` (and CI) and `make quickstart`.
#
#   VENV=.venv           where the environment lives
#   PYTHON=python3       interpreter that creates it
#   EXTRAS=dev           the package's extras to install: `dev` (the tests' packages: `make test`,
#                        `make setup`), empty (the package alone: `make quickstart`, `make setup-run`)
#   TORCH_SPEC=torch==2.13.0                               torch requirement installed first (see below)
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu   the index it comes from
#
# torch: pyproject.toml asks for a range (GPU users need their CUDA build, which the
# package index serves). On a machine without an NVIDIA GPU that range would pull the
# multi-GB CUDA build too, so TORCH_SPEC is installed first from PyTorch's CPU wheel index
# (the `+cpu` builds); the range is then met and pip pulls nothing more. Only torch comes
# from that index (--no-deps): its own dependencies come from the package index with the
# project's. pip also takes a CPU wheel it finds on disk through its find-links setting
# (PIP_FIND_LINKS): where the CPU index cannot be reached, as on this project's machines
# and CI, pip warns that it could not fetch the index page and installs that wheel. With
# neither, pip fails with "No matching distribution" rather than fall back to CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS-dev}
spec=.${EXTRAS:+[$EXTRAS]}
stamp="$VENV/.ggpo-installed-${EXTRAS:-base}"

# up to date: these extras, or the dev extra (which holds every other), installed since pyproject.toml changed
for installed in "$stamp" "$VENV/.ggpo-installed-dev"; do
    if [ -f "$installed" ] && [ "$installed" -nt pyproject.toml ]; then
        exit 0
    fi
done
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
if ! command -v nvidia-smi >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install --quiet --no-deps --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" \
        "${TORCH_SPEC:-torch==2.13.0}"
fi
"$VENV/bin/python" -m pip install --quiet -e "$spec"
touch "$stamp"
