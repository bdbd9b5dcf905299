# Makefile fragment for the local control plane (testenv/). Included from the
# top-level Makefile; all paths are relative to the repository root.
#
#   make testenv        build .cache/testenv/bin/testenv (incremental)
#   make celref         build .cache/testenv/bin/celref, the scheduler's CEL for differential tests
#   make testenv-check  go.mod agrees with testenv/K8S_VERSION; go vet
#   make testenv-pin    rewrite testenv/go.mod for testenv/K8S_VERSION
#   make cluster        start a local control plane in the background
#   make cluster-down   stop it

TESTENV_DIR     := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
TESTENV_ROOT    := $(abspath $(TESTENV_DIR)/..)
TESTENV_BIN     ?= $(TESTENV_ROOT)/.cache/testenv/bin/testenv
CELREF_BIN      ?= $(TESTENV_ROOT)/.cache/testenv/bin/celref
TESTENV_GO      ?= go
TESTENV_PYTHON  ?= $(TESTENV_ROOT)/.venv/bin/python
K8S_VERSION     := $(strip $(file < $(TESTENV_DIR)/K8S_VERSION))
K8S_MINOR       := $(word 2,$(subst ., ,$(K8S_VERSION)))
TESTENV_SOURCES := $(shell find $(TESTENV_DIR) -name '*.go' -not -path '*/testdata/*') \
                   $(TESTENV_DIR)/go.mod $(TESTENV_DIR)/go.sum $(TESTENV_DIR)/K8S_VERSION
# Stamp the version reported by /version and `kubectl version`.
TESTENV_LDFLAGS := $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
                   -X $(p).gitVersion=$(K8S_VERSION) -X $(p).gitMajor=1 -X $(p).gitMinor=$(K8S_MINOR) \
                   -X $(p).gitTreeState=clean)
# Extra arguments for `make cluster`, e.g. CLUSTER_ARGS="--node node-a:gpu=true"
CLUSTER_ARGS    ?=

.PHONY: testenv celref testenv-check testenv-pin cluster cluster-down

testenv: $(TESTENV_BIN)

$(TESTENV_BIN): $(TESTENV_SOURCES)
	@command -v $(TESTENV_GO) >/dev/null || { echo "testenv: '$(TESTENV_GO)' not found; install Go (see $(TESTENV_DIR)/go.mod)" >&2; exit 1; }
	@mkdir -p $(dir $@)
	cd $(TESTENV_DIR) && ./pin.sh --check >/dev/null && \
	  $(TESTENV_GO) build -ldflags '$(TESTENV_LDFLAGS)' -o $@.tmp ./cmd/testenv
	@mv -f $@.tmp $@

# A separate, small binary: it links in seconds and starts fast for the test session.
celref: $(CELREF_BIN)

$(CELREF_BIN): $(TESTENV_SOURCES)
	@command -v $(TESTENV_GO) >/dev/null || { echo "celref: '$(TESTENV_GO)' not found; install Go (see $(TESTENV_DIR)/go.mod)" >&2; exit 1; }
	@mkdir -p $(dir $@)
	cd $(TESTENV_DIR) && ./pin.sh --check >/dev/null && \
	  $(TESTENV_GO) build -o $@.tmp ./cmd/celref
	@mv -f $@.tmp $@

testenv-check:
	cd $(TESTENV_DIR) && ./pin.sh --check && $(TESTENV_GO) vet ./...

testenv-pin:
	cd $(TESTENV_DIR) && ./pin.sh

cluster: install $(TESTENV_BIN)
	DRA_TESTENV_BIN=$(TESTENV_BIN) $(TESTENV_PYTHON) -m devenv.localcluster up $(CLUSTER_ARGS)

cluster-down: install
	$(TESTENV_PYTHON) -m devenv.localcluster down
