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

Each step below was measured with `bench/bench_node.py --quick` on the same machine; the
table above is the full run after all of them.

1. **Group commit** (`kubeletplugin/node_service.py`). Before: every NodePrepareResources call
   took the node lock alone and paid for its own two checkpoint writes and CDI spec;
   concurrency 16: p50 140 ms / p99 204 ms, 59 claims/s; concurrency 64: p50 562 ms, 53
   claims/s. Calls that queue behind a running driver call are now merged into one driver call
   (consecutive calls of the same kind only, so prepares and unprepares keep their order).
   After: concurrency 16: p50 76 ms, 106 claims/s; concurrency 64: p50 258 ms, 137 claims/s.
2. **The agent's own API client** (`dra_driver/kube.py`). `import kubernetes.aio.client`
   imports every generated model of Kubernetes; the agent only sends raw JSON to a handful of
   endpoints. Idle RSS: 87.9 MiB before, 73.3 MiB after (dgx-h100 profile, 10 s idle); the
   benchmark's 72-GPU agent: 89.3 MiB before, 74.6 MiB after. `import dra_driver.agent` alone:
   76 MiB before, 68 MiB after (a bare interpreter is 10 MiB, `import grpc` 29 MiB).
3. **Claim status written after 0.5 s, set+clear pairs dropped** (`claimreport.py`). Each
   prepare+unprepare cycle used to cost two server-side applies on the claim's status besides
   the claim read; a claim unprepared within half a second of its prepare now costs none.
4. **One directory fsync per batch** for the CDI specs (`gpu/state.py`, `cdi/writer.py`).
   cProfile of `DeviceState` alone (500 cycles of one claim, fsync on): 2.9 ms per
   prepare+unprepare, 1.9 ms of it in 9 fsyncs; in batches of eight claims 0.8 ms per claim.

Quick runs before steps 3-4 and after them (load average 0.5): concurrency 1: p50 4.99 ms ->
5.2 ms, 129 -> 124 claims/s (noise); concurrency 16: p50 44 ms -> 35.5 ms, p99 82 ms -> 58 ms,
182 -> 253 claims/s; concurrency 64: 199 -> 210 claims/s.

What remains, from a cProfile of the agent process under load at concurrency 16 (1,000
cycles): the event loop spends about half its time idle in `epoll`, waiting for the API
server's answers to the claim reads and for the worker thread's fsyncs; the rest is spread over
asyncio, gRPC and aiohttp bookkeeping with no single hot spot. The API server, the kubelet
harness and the benchmark client (also Python, 16 concurrent gRPC callers) share the same two
cores. A p50 of 5 ms at concurrency 16 means sixteen claim reads, one batched checkpoint and
sixteen CDI specs within 5 ms, end to end, on two shared cores: the prepare p50 of about 5 ms at
concurrency 1 is what one claim costs, and at concurrency 16 the latency is the queue in front
of the API server and the disk. The throughput target (200 claims/s at concurrency 16) is met;
the latency targets at concurrency 16 are not, for that reason. The agent reads each claim from
the API server on every prepare, as the kubelet plugin library does; caching claims with a
cluster-wide watch would remove the read but make every node agent watch every claim of the
cluster, which costs more than it saves at scale."""

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
