# Benchmarks: numbers, not pass/fail. `make bench` runs them and regenerates
# docs/performance.md (60-95 min on a fresh clone with SCALE_NODES="100 500", with the
# machine's speed, measured: the node agent against the reference 11-13 minutes, of which
# the publisher's steady state is watched for 5; then the scheduler's allocator per node
# layout, a minute; then the scale benchmark publishes and schedules on 10, 100 and 500
# simulated nodes, five layouts each, each row on a control plane of its own, and the
# agent's publisher is compared with the upstream Go controller on the same pools).
# SCALE_NODES picks other counts.
# `make bench BENCH_FLAGS=--quick` is a 2-minute run for iterating; its figures are not the
# recorded ones.
BENCH_FLAGS ?=
# The Go reference kubelet plugin (kubernetes-sigs/dra-example-driver's
# dra-example-kubeletplugin, built outside this repository) to measure beside ours; without
# it the benchmark measures this driver alone and says so. REFERENCE_VERSION is what it was
# built from (recorded on the page).
REFERENCE_BIN     ?=
REFERENCE_VERSION ?= unknown
BENCH_OUT   := bench/results
SCALE_NODES ?= 10 100 500

.PHONY: bench
bench: install testenv
	@mkdir -p $(BENCH_OUT)
	$(BIN)/python bench/bench_cel.py > $(BENCH_OUT)/cel.txt
	$(BIN)/python bench/bench_node.py $(BENCH_FLAGS) --json $(BENCH_OUT)/node.json \
		$(if $(REFERENCE_BIN),--reference-bin '$(REFERENCE_BIN)' --reference-version '$(REFERENCE_VERSION)')
	$(BIN)/python bench/bench_allocator.py --json $(BENCH_OUT)/allocator.json
	$(BIN)/python bench/bench_scale.py --nodes $(SCALE_NODES) --json $(BENCH_OUT)/scale.json
	$(BIN)/python bench/bench_publish.py --nodes $(SCALE_NODES) \
		--layouts static dynamic-capacity dynamic --json $(BENCH_OUT)/publish.json
	$(BIN)/python bench/report.py $(BENCH_OUT)/node.json $(BENCH_OUT)/cel.txt \
		$(BENCH_OUT)/scale.json $(BENCH_OUT)/allocator.json $(BENCH_OUT)/publish.json \
		> docs/performance.md
	@echo "wrote docs/performance.md"
