"""Render docs/performance.md from the benchmark results.

Run: ``.venv/bin/python bench/report.py bench/results/node.json bench/results/cel.txt``
(``make bench`` does this after running the benchmarks). Prints Markdown on stdout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TARGETS = {
    "prepare_p50_ms": 5.0,
    "prepare_p99_ms": 20.0,
    "claims_per_s": 200.0,
    "startup_s": 1.5,
    "idle_rss_mib": 80.0,
}


def _mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def render(node: dict[str, Any], cel: str) -> str:
    m = node["machine"]
    out: list[str] = []
    add = out.append
    add("# Performance")
    add("")
    add("Numbers, not pass/fail: `make bench` runs `bench/bench_cel.py` and `bench/bench_node.py`")
    add("and regenerates this page from their results (`bench/results/`).")
    add("")
    add(
        f"Machine: {m['cpus']} CPUs, `{m['cpu']}` (a shared virtual machine), Python "
        f"{m['python']}, Linux {m['kernel']}. Load average (1/5/15 min) before the node "
        f"benchmark: {m['load_before']}; after: {m.get('load_after', '?')}. The machine was "
        "shared with other work, so figures vary by tens of percent between runs."
    )
    if node.get("quick"):
        add("")
        add("**These figures come from a `--quick` run and are not the recorded ones.**")
    add("")
    add("## Node agent")
    add("")
    add(
        "`bench/bench_node.py` starts a local control plane (kube-apiserver, scheduler, "
        "controller manager, `kubelet-dra`), then the real agent process "
        "(`dra-driver run --backend simulated`) on a profile of 72 L4 GPUs. The claims are "
        "ResourceClaim objects in the API server whose `status.allocation` is written through "
        "the status subresource, so every prepare reads its claim from the API server, as with "
        "a real kubelet. The client is built from the protos (`dra_driver/_proto`) and talks to "
        "the DRA socket; each worker prepares and unprepares its own 1-GPU claim in a loop. "
        "fsync stays on (two checkpoint writes per batch, one CDI spec per claim)."
    )
    add("")
    add("### NodePrepareResources / NodeUnprepareResources")
    add("")
    add(
        "| concurrency | cycles | prepare p50 | prepare p99 | unprepare p50 | unprepare p99 "
        "| claims/s (prepared and unprepared) |"
    )
    add("|---|---|---|---|---|---|---|")
    for r in node["latency"]:
        add(
            f"| {r['concurrency']} | {r['cycles']} | {r['prepare_p50_ms']} ms | "
            f"{r['prepare_p99_ms']} ms | {r['unprepare_p50_ms']} ms | {r['unprepare_p99_ms']} ms "
            f"| {r['claims_per_s']} |"
        )
    c16 = next(r for r in node["latency"] if r["concurrency"] == 16)
    best = max(r["claims_per_s"] for r in node["latency"])
    add("")
    add(
        f"Targets at concurrency 16: prepare p50 < 5 ms ({_verdict(c16['prepare_p50_ms'] < 5)}), "
        f"p99 < 20 ms ({_verdict(c16['prepare_p99_ms'] < 20)}); >= 200 claims/s "
        f"({_verdict(best >= 200)}, best {best}/s)."
    )
    add("")
    add("### Start-up")
    add("")
    s = node["startup"]
    add(
        "From process start (fork/exec) to the agent logging its registration with "
        "`kubelet-dra`, and to all 72 devices being visible in the API server (the slices of an "
        f"earlier run deleted first). {s['runs']} runs:"
    )
    add("")
    add("| step | median | all runs |")
    add("|---|---|---|")
    add(
        f"| registered with the kubelet | {s['registered_median_s']} s | "
        f"{', '.join(map(str, s['registered_s']))} |"
    )
    add(
        f"| slices published | {s['published_median_s']} s | "
        f"{', '.join(map(str, s['published_s']))} |"
    )
    add("")
    add(f"Target < 1.5 s: {_verdict(s['published_median_s'] < 1.5)}.")
    add("")
    add("### Memory and file descriptors")
    add("")
    idle = node["memory_idle"]
    samples = node["memory_cycles"]
    add(
        f"Idle (3 s after the slices are published): RSS {_mib(idle['rss_kib'])}, "
        f"{idle['fds']} open descriptors. Then during prepare/unprepare cycles "
        "(concurrency 1, 16, 64, then 16):"
    )
    add("")
    add("| cycles done | RSS | open fds |")
    add("|---|---|---|")
    add(f"| 0 | {_mib(idle['rss_kib'])} | {idle['fds']} |")
    for sample in samples:
        add(f"| {sample['cycles']} | {_mib(sample['rss_kib'])} | {sample['fds']} |")
    add("")
    add(
        f"Target idle RSS < 80 MiB: {_verdict(idle['rss_kib'] / 1024 < 80)}. Growth from the "
        f"first to the last sample: {_mib(samples[-1]['rss_kib'] - samples[0]['rss_kib'])}."
    )
    add("")
    add("### Publisher")
    add("")
    st = node["steady_state"]
    rep = node["repair_s"]
    big = node["big_node"]
    add("| measurement | result |")
    add("|---|---|")
    add(
        f"| API writes in a {st['seconds']:.0f} s steady state (agent's own request counter, "
        f"non-GET verbs) | {st['api_writes']} |"
    )
    add(f"| watch events on the node's slices in the same window | {st['slice_events']} |")
    add(
        f"| repair a deleted slice (delete -> all devices back) | median "
        f"{sorted(rep)[len(rep) // 2]} s ({', '.join(map(str, rep))}) |"
    )
    add(
        f"| {big['devices']} MIG devices (30 A100 x 7 1g.5gb): process start -> registered | "
        f"median {big['registered_median_s']} s |"
    )
    add(
        f"| {big['devices']} MIG devices: process start -> all published | median "
        f"{big['published_median_s']} s ({', '.join(map(str, big['published_s']))}) |"
    )
    add("")
    add(HISTORY)
    add("")
    add(CEL_INTRO)
    add("")
    add("Latest output of `bench/bench_cel.py`:")
    add("")
    add("```")
    add(cel.strip())
    add("```")
    add("")
    add(CEL_HOW)
    return "\n".join(out) + "\n"


HISTORY = """### Where the prepare time goes, and what was changed

Measured before the change below (same machine, `--quick` run, load average about 2):
concurrency 1: prepare p50 8.2 ms / p99 21 ms, 67 claims/s; concurrency 16: p50 140 ms /
p99 204 ms, 59 claims/s; concurrency 64: p50 562 ms / p99 904 ms, 53 claims/s. Throughput did
not grow with concurrency: every NodePrepareResources call took the node lock alone and paid
for its own two checkpoint writes (each a write, an fsync and a directory fsync) and its CDI
spec, and the worker thread doing the fsyncs competed for the GIL with the event loop.

Change: `NodeService` merges calls that queue up behind a running driver call into one driver
call (group commit, `kubeletplugin/node_service.py`); a run of consecutive calls of the same kind
is merged, so prepares and unprepares keep their order, and a cancelled caller's claims are
retried by the others. After it (`--quick`, same load): concurrency 16: p50 76 ms, 106 claims/s;
concurrency 64: p50 258 ms, 137 claims/s.

What remains, from a cProfile of the agent and of `DeviceState` alone: `DeviceState` needs about
5 ms of a core per prepare+unprepare cycle on its own (9 fsyncs, 3 ms of them), and each cycle
also costs three HTTPS requests from the Python client (the claim read for prepare, and the two
claim status writes of `ClaimReporter`), each a few milliseconds of CPU on this machine. With 2
cores shared by the API server, the kubelet and the benchmark client, the agent tops out near
150 claims/s, and the latency at concurrency 16 is the queue in front of it. Reaching 5 ms p50
at concurrency 16 would need about 3,000 claims/s: not a goal a Python agent with fsync on and an
API read per claim can meet on 2 cores; the reporter's status writes are the next thing to
coalesce.

Idle memory: the agent is at 75 MiB after its imports alone, before doing anything (`python -c
"import dra_driver.agent"`, maximum RSS). A bare interpreter takes 10 MiB; `import grpc` 29 MiB;
`import kubernetes.aio.client` 54 MiB, because the generated client package imports every API
class and model of Kubernetes. The agent uses a handful of calls; doing them with its own small
HTTP layer (as `resourceslice/rawapi.py` already does for slices) instead of the generated
client is what would bring the idle figure under 80 MiB. The RSS reached after the first
thousand cycles stays flat to the end of the 10,000 cycles: no growth."""

CEL_INTRO = (
    """## CEL selector evaluation

`bench/bench_cel.py` evaluates five representative selectors over a generated inventory of
10,000 devices (the devices of the built-in simulated profiles `dgx-a100`, `dgx-h100`, `l4x4`
and `mixed`, repeated over as many nodes as needed: full GPUs and MIG devices of A100, H100
and L4):

| # | selector |
|---|---|
| 1 | `device.capacity["gpu.dra.dev"].memory.compareTo(quantity("40Gi")) >= 0` |
| 2 | `device.attributes["gpu.dra.dev"].productName.matches("^NVIDIA (H100\\|A100)")` |
| 3 | `device.attributes["gpu.dra.dev"].architecture == "Hopper"` |
| 4 | `device.attributes["gpu.dra.dev"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0` |
| 5 | `has(device.attributes["gpu.dra.dev"].migEnabled) && """
    """!device.attributes["gpu.dra.dev"].migEnabled && """
    """device.attributes["gpu.dra.dev"].numaNode == 0` |

Command: `.venv/bin/python bench/bench_cel.py` (`--devices N`, `--baseline N` cel-python
samples). Earlier runs on the same machine: compile 5 selectors cold 110-185 ms; convert 10,000
devices 120-140 ms; 50,000 verdicts 165-240 ms (210,000-300,000 evaluations/s); `match` over
10,000 devices x 5 selectors with an explanation of every non-match **0.56-0.84 s** (target
under 1 s: met); cel-python's own interpreter 140-225 µs per evaluation."""
)

CEL_HOW = """How: cel-python supplies the parser only. Its interpreter walks the lark tree and
resolves names through layered activations on every evaluation (about 0.15-0.7 ms each here, so
50,000 evaluations would take 7-35 s). `dra_driver.cel.compiler` instead turns each tree once into
Python closures over plain Python values; compiled selectors are cached by their text; calls
with constant arguments (`quantity("40Gi")`, `semver("8.0.0")`) are folded at compile time;
each device is converted to CEL values once and reused for every selector; parsed quantities
and versions are cached (devices of one product share them); explanations reuse compiled
sub-expressions and the list of device lookups per expression."""


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: report.py NODE_JSON CEL_TXT", file=sys.stderr)
        return 2
    node = json.loads(Path(argv[0]).read_text())
    cel = Path(argv[1]).read_text()
    sys.stdout.write(render(node, cel))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
