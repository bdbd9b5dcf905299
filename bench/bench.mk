# Benchmarks: numbers, not pass/fail. `make bench` runs them and regenerates docs/performance.md
# (about 10 minutes: the publisher's steady state is watched for 5 of them).
# `make bench BENCH_FLAGS=--quick` is a 2-minute run for iterating; its figures are not the
# recorded ones.
BENCH_FLAGS ?=
BENCH_OUT   := bench/results

.PHONY: bench
bench: install testenv
	@mkdir -p $(BENCH_OUT)
	$(BIN)/python bench/bench_cel.py > $(BENCH_OUT)/cel.txt
	$(BIN)/python bench/bench_node.py $(BENCH_FLAGS) --json $(BENCH_OUT)/node.json
	$(BIN)/python bench/report.py $(BENCH_OUT)/node.json $(BENCH_OUT)/cel.txt > docs/performance.md
	@echo "wrote docs/performance.md"
