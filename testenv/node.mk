# Makefile fragment for the real node (testenv/node/): the local control plane plus one
# node made of the upstream kubelet, containerd, runc and CNI plugins, with the driver
# installed by its Helm chart. Included from the top-level Makefile. Needs root.
#
#   make node-up     build what is missing, start it all; prints KUBECONFIG and the node
#                    (NODES=2: a second node, dra-node-1, in namespaces of its own)
#   make node-down   stop it and remove every process, mount, interface and cgroup
#   make e2e-node    the real-node test tier (starts the node when it is not running)
#   make test-node   e2e-node on a fresh node, removed afterwards (the step of `make test`)
#   make demo-node   the examples on the node: what each container saw
#   make node-images rebuild the images (pause, busybox, the driver's from the Dockerfile)
#
# NODE_BACKEND=simulated|nvml picks the agent's discovery backend (nvml: the stand-in NVIDIA
# driver root, tests/driverroot.py) and NODE_HELM_ARGS adds `helm install` arguments after
# the tier's own values. On a running node, node-up with other values re-installs the chart
# (helm upgrade): the node, its images and the control plane stay. NODES=N (default 1)
# runs N nodes, dra-node-0 on the host and the others each in a network and mount namespace
# of its own (docs/real-node.md); node-up with another NODES than the running one starts
# afresh. `make e2e-node NODES=2` runs the tier on two nodes (tests/node/test_two_nodes.py
# needs them; the other tests pin their pods to dra-node-0).

NODE_DIR         := $(TESTENV_DIR)/node
NODE_CACHE       := $(TESTENV_ROOT)/.cache/node
NODE_BASE        ?= /var/lib/dra-node
CONTAINERD_VERSION  ?= v2.4.2
CNI_PLUGINS_VERSION ?= v1.9.1
# Debian's runc (1.1.5) fails every pod sandbox here with "can't get final child's PID
# from pipe: EOF"; this release starts them. Built with seccomp (libseccomp-dev).
RUNC_VERSION     ?= v1.5.2
# Without the graph drivers and snapshotters that need C libraries this machine lacks.
CONTAINERD_TAGS  := no_btrfs no_devmapper no_zfs no_aufs
CONTAINERD_BINS  := $(addprefix $(NODE_CACHE)/bin/,containerd containerd-shim-runc-v2 ctr)
CNI_BINS         := $(addprefix $(NODE_CACHE)/cni/,bridge host-local loopback portmap)
NODE_IMAGES      := $(addprefix $(NODE_CACHE)/images/,pause.tar busybox.tar driver.tar)
DRIVER_IMAGE     ?= localhost/dra-driver:dev
NODE_PY          := $(TESTENV_PYTHON) $(NODE_DIR)/realnode.py --base $(NODE_BASE)
NODE_BACKEND     ?= simulated
NODE_HELM_ARGS   ?=
NODES            ?= 1
NODE_MODE         = --backend $(NODE_BACKEND) --helm-args '$(NODE_HELM_ARGS)'
NODE_ROOT_CHECK   = @[ "$$(id -u)" = 0 ] || { echo "$@: needs root (containers, mounts, a bridge, cgroups)" >&2; exit 1; }

.PHONY: node-artifacts node-up node-down node-status node-images node-packages e2e-node test-node demo-node

# Each Go build prints what it builds, its progress and its time (hack/buildprogress.py).
$(CONTAINERD_BINS) &:
	@GOBIN=$(NODE_CACHE)/bin $(call go_progress,containerd,containerd $(CONTAINERD_VERSION),containerd$(comma) its runc shim and ctr for the real node) \
	  $(TESTENV_GO) install -tags '$(CONTAINERD_TAGS)' \
	  $(foreach c,containerd containerd-shim-runc-v2 ctr,github.com/containerd/containerd/v2/cmd/$(c)@$(CONTAINERD_VERSION))

$(NODE_CACHE)/bin/runc:
	@GOBIN=$(NODE_CACHE)/bin CGO_ENABLED=1 $(call go_progress,runc,runc $(RUNC_VERSION),the OCI runtime of the real node) \
	  $(TESTENV_GO) install -tags seccomp github.com/opencontainers/runc@$(RUNC_VERSION)

$(CNI_BINS) &:
	@GOBIN=$(NODE_CACHE)/cni CGO_ENABLED=0 $(call go_progress,cni,CNI plugins $(CNI_PLUGINS_VERSION),bridge$(comma) host-local$(comma) loopback and portmap for the pod network of the real node) \
	  $(TESTENV_GO) install \
	  $(foreach p,main/bridge ipam/host-local main/loopback meta/portmap,github.com/containernetworking/plugins/plugins/$(p)@$(CNI_PLUGINS_VERSION))

$(NODE_CACHE)/bin/pause: $(TESTENV_DIR)/cmd/pause/main.go
	@cd $(TESTENV_DIR) && CGO_ENABLED=0 $(call go_progress,pause,pause,the binary of the pause image of the real node) \
	  $(TESTENV_GO) build -ldflags '-s -w' -o $@ ./cmd/pause

$(NODE_CACHE)/images/pause.tar: $(NODE_CACHE)/bin/pause $(NODE_DIR)/ociimage.py
	@mkdir -p $(dir $@)
	python3 $(NODE_DIR)/ociimage.py pause --binary $< --out $@

$(NODE_CACHE)/images/busybox.tar: $(NODE_DIR)/ociimage.py
	@mkdir -p $(dir $@)
	python3 $(NODE_DIR)/ociimage.py busybox --out $@

$(NODE_CACHE)/images/driver.tar: Dockerfile pyproject.toml $(shell find dra_driver -name '*.py' -o -name '*.yaml') $(NODE_DIR)/images.sh
	$(NODE_DIR)/images.sh $(NODE_CACHE)/images $(DRIVER_IMAGE)

node-images: $(NODE_IMAGES)

# Tools from Debian when missing: buildah and mmdebstrap for the driver's image,
# libseccomp-dev to build runc, iptables, busybox for the test image, gcc for the simulated
# driver root's libraries and the loader checks (tests/node/test_driver_files.py).
node-packages:
	$(NODE_ROOT_CHECK)
	@missing=""; for p in /usr/include/seccomp.h:libseccomp-dev pkg-config:pkg-config buildah:buildah mmdebstrap:mmdebstrap iptables:iptables busybox:busybox-static gcc:gcc; do \
	  command -v $${p%%:*} >/dev/null || [ -e $${p%%:*} ] || missing="$$missing $${p#*:}"; done; \
	[ -z "$$missing" ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; }

# The node's binaries and images, two at a time, images first: the driver's image (mostly
# downloads and unpacking) builds while Go compiles. These links are small (containerd's
# peaks at 0.8 GB). Silent when all are present.
node-artifacts: $(NODE_IMAGES) $(CONTAINERD_BINS) $(NODE_CACHE)/bin/runc $(CNI_BINS)
	@:

node-up: install testenv helm
	$(NODE_ROOT_CHECK)
	@$(MAKE) --no-print-directory node-packages
	@$(MAKE) --no-print-directory -j2 node-artifacts
	DRA_TESTENV_BIN=$(TESTENV_BIN) $(NODE_PY) up --bin-dir $(NODE_CACHE)/bin --cni-dir $(NODE_CACHE)/cni \
	  $(foreach i,$(NODE_IMAGES),--image $(i)) --runc $(NODE_CACHE)/bin/runc --helm $(HELM) --chart deployments/helm/dra-driver \
	  --driver-image $(DRIVER_IMAGE) --nodes $(NODES) $(NODE_MODE)

node-down:
	$(NODE_ROOT_CHECK)
	$(NODE_PY) down

node-status:
	$(NODE_PY) status

e2e-node: node-up
	DRA_NODE_BASE=$(NODE_BASE) DRA_NODE_HELM=$(HELM) DRA_NODE_CTR=$(NODE_CACHE)/bin/ctr \
	  $(BIN)/pytest -m node tests/node

test-node:
	@$(MAKE) --no-print-directory node-down
	@$(MAKE) --no-print-directory e2e-node; rc=$$?; $(MAKE) --no-print-directory node-down; exit $$rc

demo-node: node-up
	DRA_NODE_HELM=$(HELM) DRA_NODE_CTR=$(NODE_CACHE)/bin/ctr $(BIN)/python -m tests.node.demo --base $(NODE_BASE)
