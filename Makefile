# Everything a fresh machine needs is installed from here: a venv with the package and its
# dev tools, the control plane for the end-to-end tests (testenv/, built with Go), and the
# stand-in NVML library (built by the tests themselves).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: first-run-note install test unit e2e e2e-core test-versions lint demo proto clean fuzz-cel fuzz-state fuzz-async hw-check
.DEFAULT_GOAL := help

help:
	@echo "make install   venv + editable install with dev tools"
	@echo "make demo      local control plane, two simulated GPU nodes, the driver, example pods"
	@echo "make test      lint + unit + end-to-end tests + the real-node tier on two nodes (root; builds"
	@echo "               on first use; TEST_NODES=1 for one),"
	@echo "               then the core end-to-end tests on the oldest Kubernetes release listed"
	@echo "make unit      unit tests only;  make e2e  end-to-end tests only"
	@echo "               K8S=1.35 (a minor or a full version from testenv/versions) runs test or"
	@echo "               e2e against that Kubernetes release instead of the newest"
	@echo "make test-versions  the end-to-end tests against every release in testenv/versions"
	@echo "make tools    helm, kustomize and hadolint for the manifest tests (built once)"
	@echo "make cluster   start a local control plane;  make cluster-down  stop it"
	@echo "make node-up   control plane + one real node (kubelet, containerd, runc) + the chart; root"
	@echo "               NODES=2: a second node in namespaces of its own (also for e2e-node)"
	@echo "make e2e-node  end-to-end tests on that node;  make node-down  remove it all"
	@echo "make fuzz-cel  random selectors against the scheduler's CEL, until interrupted"
	@echo "make fuzz-state  the node's claim state against its model with fresh seeds;"
	@echo "make fuzz-async  the async loops under perturbed scheduling with fresh seeds;"
	@echo "               both for FUZZ_SECONDS=N seconds (until interrupted when unset)"
	@echo "make bench     benchmarks (about an hour); results in docs/performance.md"
	@echo "make hw-check  pre-flight of this node's NVIDIA driver and GPUs (skipped without one);"
	@echo "               HW_CHECK_ARGS=\"--carve --mps\" also makes a MIG device and an MPS daemon"

install: $(STAMP)

$(STAMP): pyproject.toml
	@echo "install: the venv $(VENV) with the package and its dev tools (quiet pip; about 30 s the first time)"
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
	$(TESTENV_ENV) $(BIN)/pytest -m e2e

# What must work on every release: the driver, its publisher, the examples, device health,
# binding conditions, cross-driver NUMA alignment, list-type attributes (or their fallback),
# ComputeDomains and claim status.
E2E_CORE := tests/e2e/test_driver.py tests/e2e/test_publisher.py tests/e2e/test_examples.py \
            tests/e2e/test_health.py tests/e2e/test_binding.py tests/e2e/test_alignment.py \
            tests/e2e/test_list_attributes.py tests/e2e/test_compute_domain.py \
            tests/e2e/test_claim_status.py

e2e-core: install testenv
	$(TESTENV_ENV) $(BIN)/pytest -m e2e $(E2E_CORE)

# The whole suite against one release (K8S, default the newest); without K8S, as CI runs it,
# then the core end-to-end tests against the oldest release too. The real-node tier runs on
# two nodes (what spans nodes, ComputeDomains, needs them; the rest pins to the first).
test: first-run-note install testenv celref tools lint
	$(TESTENV_ENV) DRA_CELREF_BIN=$(CELREF_BIN) $(BIN)/pytest
ifeq ($(K8S),)
	$(MAKE) --no-print-directory e2e-core K8S=$(K8S_OLDEST)
endif
	$(MAKE) --no-print-directory test-node NODES=$(or $(TEST_NODES),2)

# One release at a time: each build needs the whole machine (see testenv/README.md).
# Each run records its outcome per test in .cache/compat/<version>.json; the README's
# compatibility table is rendered from those files.
test-versions: install
	@rm -rf .cache/compat; failed=""; for v in $(TESTENV_VERSIONS); do \
	  DRA_E2E_REPORT=$(CURDIR)/.cache/compat/$$v.json $(MAKE) --no-print-directory e2e K8S=$$v \
	    || failed="$$failed $$v"; done; \
	  $(BIN)/python hack/compat_table.py --write; \
	  [ -z "$$failed" ] || { echo "end-to-end tests failed on:$$failed" >&2; exit 1; }

# The generated half of tests/unit/cel/test_differential.py with a fresh seed and no bound.
fuzz-cel: install celref
	CEL_FUZZ=1 DRA_CELREF_BIN=$(CELREF_BIN) $(BIN)/pytest -m "not e2e" -x -q -p no:cacheprovider tests/unit/cel/test_differential.py -k generated

# Fresh seeds for the stateful and interleaving suites (bounded runs are part of make test).
fuzz-state: install
	$(BIN)/python -m tests.fuzz_state --seconds $(or $(FUZZ_SECONDS),0)

fuzz-async: install
	$(BIN)/python -m tests.fuzz_async --seconds $(or $(FUZZ_SECONDS),0)

demo: first-run-note install testenv
	$(TESTENV_ENV) $(BIN)/dra-driver demo

# On a real GPU node: the driver, discovery against nvidia-smi -L, MIG, health events (and
# with HW_CHECK_ARGS="--carve --mps" a MIG device and an MPS daemon, made and removed).
hw-check: install
	$(BIN)/dra-driver hw-check $(HW_CHECK_ARGS)

proto: install
	hack/gen-proto.sh

# On a fresh machine, say first what the first run builds and about how long it takes
# (testenv/README.md); each build then reports its own progress and time.
first-run-note:
	@[ -x $(TESTENV_BIN) ] || echo "first run: make $(or $(MAKECMDGOALS),$@) builds the control plane, testenv $(K8S_VERSION), from the Kubernetes sources with Go: 6-11 min on 2 cores (later runs: seconds)"

clean:
	rm -rf $(VENV) .cache

include testenv/testenv.mk
include hack/tools.mk
include testenv/node.mk
include bench/bench.mk
