# Everything a fresh machine needs is installed from here: a venv with the package and its
# dev tools, the control plane for the end-to-end tests (testenv/, built with Go), and the
# stand-in NVML library (built by the tests themselves).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test unit e2e lint demo proto clean fuzz-cel
.DEFAULT_GOAL := help

help:
	@echo "make install   venv + editable install with dev tools"
	@echo "make demo      local control plane, two simulated GPU nodes, the driver, example pods"
	@echo "make test      lint + unit + end-to-end tests + the real-node tier (root; builds on first use)"
	@echo "make unit      unit tests only;  make e2e  end-to-end tests only"
	@echo "make tools    helm, kustomize and hadolint for the manifest tests (built once)"
	@echo "make cluster   start a local control plane;  make cluster-down  stop it"
	@echo "make node-up   control plane + one real node (kubelet, containerd, runc) + the chart; root"
	@echo "make e2e-node  end-to-end tests on that node;  make node-down  remove it all"
	@echo "make fuzz-cel  random selectors against the scheduler's CEL, until interrupted"
	@echo "make bench     benchmarks (about an hour); results in docs/performance.md"

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

lint: install
	$(BIN)/ruff check dra_driver devenv tests bench
	$(BIN)/ruff format --check dra_driver devenv
	$(BIN)/mypy

unit: install tools
	$(BIN)/pytest -m "not e2e"

e2e: install testenv
	$(BIN)/pytest -m e2e

test: install testenv celref tools lint
	$(BIN)/pytest
	$(MAKE) --no-print-directory test-node

# The generated half of tests/unit/cel/test_differential.py with a fresh seed and no bound.
fuzz-cel: install celref
	CEL_FUZZ=1 $(BIN)/pytest -m "not e2e" -x -q -p no:cacheprovider tests/unit/cel/test_differential.py -k generated

demo: install testenv
	$(BIN)/dra-driver demo

proto: install
	hack/gen-proto.sh

clean:
	rm -rf $(VENV) .cache

include testenv/testenv.mk
include hack/tools.mk
include testenv/node.mk
include bench/bench.mk
