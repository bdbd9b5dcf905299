# Makefile fragment for the local control plane (testenv/). Included from the
# top-level Makefile; all paths are relative to the repository root.
#
#   make testenv        build .cache/testenv/<version>/bin/testenv (incremental)
#   make testenvs       build it for every release in testenv/versions, one at a time
#   make celref         build .cache/testenv/<newest>/bin/celref, the scheduler's CEL for differential tests
#   make testenv-check  the modfiles agree with testenv/versions; go vet
#   make testenv-pin    rewrite testenv/mod/<version>/go.mod and go.sum for every listed release
#   make cluster        start a local control plane in the background
#   make cluster-down   stop it
#
# K8S selects the release (a minor such as 1.35, or a full version); the default is the
# newest one listed in testenv/versions. Each release has its own modfile
# (testenv/mod/<version>/) and binary; see testenv/README.md.

TESTENV_DIR     := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
TESTENV_ROOT    := $(abspath $(TESTENV_DIR)/..)
TESTENV_PIN     := $(TESTENV_DIR)/pin.sh
TESTENV_VERSIONS := $(shell $(TESTENV_PIN) --list)
K8S             ?=
K8S_VERSION     := $(shell $(TESTENV_PIN) --resolve '$(K8S)')
$(if $(K8S_VERSION),,$(error K8S=$(K8S) is not a release listed in $(TESTENV_DIR)/versions: $(TESTENV_VERSIONS)))
K8S_MINOR       := $(word 2,$(subst ., ,$(K8S_VERSION)))
K8S_OLDEST      := $(firstword $(TESTENV_VERSIONS))
K8S_NEWEST      := $(lastword $(TESTENV_VERSIONS))
TESTENV_CACHE   := $(TESTENV_ROOT)/.cache/testenv/$(K8S_VERSION)
TESTENV_BIN     ?= $(TESTENV_CACHE)/bin/testenv
# The CEL engine follows the newest release's scheduler, whatever K8S selects.
CELREF_BIN      ?= $(TESTENV_ROOT)/.cache/testenv/$(K8S_NEWEST)/bin/celref
TESTENV_GO      ?= go
comma           := ,
TESTENV_PYTHON  ?= $(TESTENV_ROOT)/.venv/bin/python
TESTENV_MODFILE := mod/$(K8S_VERSION)/go.mod
TESTENV_TAGS    := $(shell $(TESTENV_PIN) --tags $(K8S_VERSION))
TESTENV_SOURCES := $(shell find $(TESTENV_DIR) -name '*.go' -not -path '*/testdata/*') \
                   $(TESTENV_DIR)/mod/$(K8S_VERSION)/go.mod $(TESTENV_DIR)/mod/$(K8S_VERSION)/go.sum
# One release's build: its modfile, its build tags (files for older releases), and the
# version reported by /version and `kubectl version`.
TESTENV_LDFLAGS := $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
                   -X $(p).gitVersion=$(K8S_VERSION) -X $(p).gitMajor=1 -X $(p).gitMinor=$(K8S_MINOR) \
                   -X $(p).gitTreeState=clean)
TESTENV_BUILD   := $(TESTENV_GO) build -modfile=$(TESTENV_MODFILE) -tags '$(TESTENV_TAGS)'
# Every Go build of the fragments runs under hack/buildprogress.py (plain python3: the venv
# may not exist yet): a banner saying what is built, why and how long it took on 2 cores,
# progress while it compiles, the elapsed time at the end. BUILDPROGRESS=0 runs them plainly.
#   $(call go_progress,KEY,NAME,WHY) go build ...   (KEY: a row of the script's timing table)
go_progress      = python3 $(TESTENV_ROOT)/hack/buildprogress.py --key $(1) --name '$(2)' --why '$(3)' --
# The control plane's feature gates: every DRA gate of the release (all), or the release's
# defaults (default), as a cluster that sets no gate runs.
K8S_GATES       ?= all
# What the tests need to find the release's binary (devenv.localcluster reads these).
TESTENV_ENV     := DRA_K8S_VERSION=$(K8S_VERSION) DRA_TESTENV_BIN=$(TESTENV_BIN) DRA_K8S_GATES=$(K8S_GATES)
# Extra arguments for `make cluster`, e.g. CLUSTER_ARGS="--node node-a:gpu=true"
CLUSTER_ARGS    ?=

.PHONY: testenv testenvs celref testenv-check testenv-pin cluster cluster-down

testenv: $(TESTENV_BIN)

$(TESTENV_BIN): $(TESTENV_SOURCES)
	@command -v $(TESTENV_GO) >/dev/null || { echo "testenv: '$(TESTENV_GO)' not found; install Go (see $(TESTENV_DIR)/go.mod)" >&2; exit 1; }
	@mkdir -p $(dir $@)
	@cd $(TESTENV_DIR) && ./pin.sh --check $(K8S_VERSION) >/dev/null && \
	  $(call go_progress,testenv,testenv $(K8S_VERSION),the local control plane (apiserver$(comma) scheduler$(comma) controller-manager$(comma) etcd$(comma) kubelet-dra) that make demo and the e2e tests run) \
	  $(TESTENV_BUILD) -ldflags '$(TESTENV_LDFLAGS)' -o $@.tmp ./cmd/testenv
	@mv -f $@.tmp $@

# A release added to testenv/versions gets its modfile on first use (commit it).
$(TESTENV_DIR)/mod/%/go.mod $(TESTENV_DIR)/mod/%/go.sum &:
	cd $(TESTENV_DIR) && ./pin.sh $*

# Sequentially: two links at once would need twice the memory (about 3.6 GB each).
testenvs:
	@set -e; for v in $(TESTENV_VERSIONS); do $(MAKE) --no-print-directory -f $(TESTENV_DIR)/testenv.mk testenv K8S=$$v; done

# A separate, small binary: it links in seconds and starts fast for the test session.
celref: $(CELREF_BIN)

$(CELREF_BIN): $(shell find $(TESTENV_DIR) -name '*.go' -not -path '*/testdata/*') \
               $(TESTENV_DIR)/mod/$(K8S_NEWEST)/go.mod $(TESTENV_DIR)/mod/$(K8S_NEWEST)/go.sum
	@command -v $(TESTENV_GO) >/dev/null || { echo "celref: '$(TESTENV_GO)' not found; install Go (see $(TESTENV_DIR)/go.mod)" >&2; exit 1; }
	@mkdir -p $(dir $@)
	@cd $(TESTENV_DIR) && ./pin.sh --check $(K8S_NEWEST) >/dev/null && \
	  $(call go_progress,celref,celref $(K8S_NEWEST),the CEL engine of the newest scheduler$(comma) the reference for the CEL differential tests) \
	  $(TESTENV_GO) build -modfile=mod/$(K8S_NEWEST)/go.mod -o $@.tmp ./cmd/celref
	@mv -f $@.tmp $@

testenv-check:
	cd $(TESTENV_DIR) && ./pin.sh --check && $(TESTENV_GO) vet -modfile=$(TESTENV_MODFILE) -tags '$(TESTENV_TAGS)' ./...

testenv-pin:
	cd $(TESTENV_DIR) && ./pin.sh

cluster: install $(TESTENV_BIN)
	$(TESTENV_ENV) $(TESTENV_PYTHON) -m devenv.localcluster up $(CLUSTER_ARGS)

cluster-down: install
	$(TESTENV_PYTHON) -m devenv.localcluster down
