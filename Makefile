# The two commands of the README. Both set up .venv first (idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-slow quickstart

setup:
	VENV=$(VENV) bash scripts/setup-venv.sh

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-slow: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m slow

quickstart: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/ggpo-train --config recipes/quickstart.yaml
