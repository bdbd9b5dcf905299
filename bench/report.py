"""Render docs/performance.md from the benchmark results.

Run: ``.venv/bin/python bench/report.py bench/results/node.json bench/results/cel.txt``
(``make bench`` does this after running the benchmarks). Prints Markdown on stdout.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from import_pss import FLOOR_LABEL

#: Goals of the node agent against the reference: latencies at most the reference's (ratio
#: <= 1.0), absolute start-up times, memory relative to the reference, fsyncs per cycle.
RATIO_GOALS = ("prepare_p50_ms", "prepare_p99_ms", "unprepare_p50_ms", "unprepare_p99_ms")
REGISTRATION_GOAL_S = 0.3
PUBLISHED_GOAL_S = 1.0
PSS_RATIO_GOAL = 1.2
#: The line of ``bench/import_pss.py``'s results that adds pydantic and one model.
PYDANTIC_MODEL = "pydantic + pydantic model"
GROWTH_GOAL_MIB = 2.0
FSYNC_GOAL = 3

HISTORY = Path(__file__).with_name("history.md")
SNAPSHOT_NOTE = " ({} per cycle; the fraction is the journal's snapshot, 4 syncs per ~1,000 cycles)"


# The run's temporary directories, shown by what they are.
_TEMP_DIRS = re.compile(r"/tmp/(dra-testenv|bench-node)-[^/ ]+")
_TEMP_NAMES = {"dra-testenv": "$CLUSTER", "bench-node": "$WORK"}


def _mib(kib: float) -> str:
    return f"{kib / 1024:.1f} MiB"


def _verdict(ok: bool | None) -> str:
    if ok is None:
        return "-"  # a figure without a goal
    return "met" if ok else "**missed**"


def _ratio(ours: float, ref: float | None) -> str:
    if ref is None:
        return "-"
    return f"{ours / ref:.2f}x" if ref else "-"


class Page:
    """The Markdown being written, with the two contenders' results side by side."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node
        self.lines: list[str] = []
        self.has_ref = "reference" in node.get("contenders", {})
        self.goals: list[tuple[str, str, str, str, str, str]] = []

    def add(self, line: str = "") -> None:
        self.lines.append(line)

    def ref(self, key: str) -> Any:
        value = self.node[key]
        return value.get("reference") if self.has_ref else None

    def goal(
        self, figure: str, ours: str, ref: str, ratio: str, goal: str, ok: bool | None
    ) -> None:
        self.goals.append((figure, ours, ref, ratio, goal, _verdict(ok)))


def render(node: dict[str, Any], cel: str) -> str:
    page = Page(node)
    _latency(page)
    _startup(page)
    _memory(page)
    _costs(page)
    _floor(page)
    _profile(page)
    _calls(page)
    body = page.lines
    page.lines = []
    _goals(page)
    goals = page.lines
    page.lines = []
    _publisher(page)
    page.add(HISTORY.read_text().strip())
    page.add()
    page.add(CEL_INTRO)
    page.add()
    page.add("Latest output of `bench/bench_cel.py`:")
    page.add()
    page.add("```")
    page.add(cel.strip())
    page.add("```")
    page.add()
    page.add(CEL_HOW)
    return "\n".join(_header(node) + goals + body + page.lines) + "\n"


def _env(contender: dict[str, Any]) -> str:
    """The environment a contender ran with, as a command line's prefix."""
    return "".join(f"{name}={value} " for name, value in contender.get("env", {}).items())


def _header(node: dict[str, Any]) -> list[str]:
    m = node["machine"]
    out = [
        "# Performance",
        "",
        "Numbers, not pass/fail: `make bench` runs `bench/bench_cel.py` and `bench/bench_node.py`",
        "and regenerates this page from their results (`bench/results/`).",
        "",
        f"Machine: {m['cpus']} CPUs, `{m['cpu']}` (a shared virtual machine), Python "
        f"{m['python']}, Linux {m['kernel']}, Kubernetes {node.get('kubernetes', '?')}. Load "
        f"average (1/5/15 min) before the node benchmark: {m['load_before']}; after: "
        f"{m.get('load_after', '?')}. A virtual machine's absolute figures vary by tens of "
        "percent between runs; the ratios come from interleaved rounds (ours, reference, "
        "floor, ours, ...) that saw the same load.",
        "",
    ]
    if node.get("quick"):
        out += ["**These figures come from a `--quick` run and are not the recorded ones.**", ""]
    contenders = node.get("contenders", {})
    out += ["## Node agent against the reference", ""]
    if "reference" not in contenders:
        out += [
            "**No reference binary was given (`make bench REFERENCE_BIN=...`): this driver was "
            "measured alone, and the ratio columns are empty.**",
            "",
        ]
    out += ["| contender | driver | version | command line |", "|---|---|---|---|"]
    for label, c in contenders.items():
        argv = _TEMP_DIRS.sub(lambda m: _TEMP_NAMES[m.group(1)], " ".join(c["argv"][1:]))
        out.append(f"| {label} | `{c['driver']}` | {c['version']} | `{_env(c)}{argv}` |")
    python_env = _env(contenders.get("ours", {}))
    out += [
        "",
        "Both serve 72 GPUs on the same `kubelet-dra` node of one local control plane, each "
        "under its own driver name; the reference is kubernetes-sigs/dra-example-driver's "
        "`dra-example-kubeletplugin` (its `gpu` profile, `--num-devices=72`), built outside this "
        "repository. Its client rate limit is lifted (`--kube-api-qps=1000 "
        "--kube-api-burst=2000`) so that its code, not its limiter, is measured; one more round "
        "keeps its shipped defaults (below). The claims are ResourceClaim objects whose "
        "`status.allocation` is written through the status subresource, so every prepare reads "
        "its claim from the API server, as with a real kubelet; fsync stays on for both. The "
        "client is built from the protos and talks to each DRA socket; each worker prepares "
        "and unprepares its own 1-GPU claim in a loop."
        + (
            " The Python contenders run with the environment the driver's image sets "
            f"(`{python_env.strip()}`, see docs/install.md) and bytecode compiled for it, as the "
            "image ships it."
            if python_env
            else ""
        ),
        "",
    ]
    return out


def _goals(page: Page) -> None:
    page.add("### Goals")
    page.add()
    page.add("| figure | ours | reference | ours / reference | goal | |")
    page.add("|---|---|---|---|---|---|")
    for row in page.goals:
        page.add("| " + " | ".join(row) + " |")
    page.add()


def _latency(page: Page) -> None:
    ours = page.node["latency"]["ours"]
    refs = page.ref("latency") or [None] * len(ours)
    page.add("### NodePrepareResources / NodeUnprepareResources")
    page.add()
    page.add("| concurrency | cycles (rounds) | figure | ours | reference | ours / reference |")
    page.add("|---|---|---|---|---|---|")
    for o, r in zip(ours, refs, strict=True):
        c = o["concurrency"]
        for key in (*RATIO_GOALS, "claims_per_s"):
            rv = r[key] if r else None
            unit = "" if key == "claims_per_s" else " ms"
            name = key.replace("_ms", "").replace("_", " ")
            page.add(
                f"| {c} | {o['cycles']} ({o['rounds']}) | {name} | {o[key]}{unit} | "
                f"{'-' if rv is None else f'{rv}{unit}'} | {_ratio(o[key], rv)} |"
            )
            if rv is None:
                continue
            if key == "claims_per_s":
                page.goal(
                    f"claims/s at {c}",
                    str(o[key]),
                    str(rv),
                    _ratio(o[key], rv),
                    ">= 1.0x",
                    o[key] >= rv,
                )
            else:
                page.goal(
                    f"{name} at {c}",
                    f"{o[key]} ms",
                    f"{rv} ms",
                    _ratio(o[key], rv),
                    "<= 1.0x",
                    o[key] <= rv,
                )
    by_c = {o["concurrency"]: o["claims_per_s"] for o in ours}
    if 16 in by_c and 64 in by_c:
        page.goal(
            "claims/s from 16 to 64 (ours)",
            f"{by_c[16]} -> {by_c[64]}",
            "",
            "",
            "rising",
            by_c[64] >= by_c[16],
        )
    page.add()
    defaults = page.node.get("reference_defaults")
    if defaults:
        page.add(
            f"The reference at its shipped client defaults ({defaults['flags']}), concurrency "
            f"16, {defaults['cycles']} cycles: prepare p50 {defaults['prepare_p50_ms']} ms, p99 "
            f"{defaults['prepare_p99_ms']} ms, {defaults['claims_per_s']} claims/s; ours at "
            f"the same concurrency is {_ratio(by_c.get(16, 0), defaults['claims_per_s'])} "
            "its throughput."
        )
        page.add()


def _startup(page: Page) -> None:
    s = page.node["startup"]
    o, r = s["ours"], page.ref("startup")
    page.add("### Start-up")
    page.add()
    page.add(
        "From process start (fork/exec) to the registration socket existing in the kubelet's "
        "registry directory, and to all 72 devices being visible in the API server (the slices "
        f"of an earlier run deleted first), {o['runs']} runs each, interleaved:"
    )
    page.add()
    page.add("| step | ours (median) | reference (median) | ours, all runs | reference, all runs |")
    page.add("|---|---|---|---|---|")
    for key, name, goal in (
        ("registered", "registration socket exists", REGISTRATION_GOAL_S),
        ("published", "slices published", PUBLISHED_GOAL_S),
    ):
        om = o[f"{key}_median_s"]
        rm = r[f"{key}_median_s"] if r else None
        page.add(
            f"| {name} | {om} s | {'-' if rm is None else f'{rm} s'} | "
            f"{', '.join(map(str, o[f'{key}_s']))} | "
            f"{', '.join(map(str, r[f'{key}_s'])) if r else '-'} |"
        )
        page.goal(
            name,
            f"{om} s",
            "-" if rm is None else f"{rm} s",
            _ratio(om, rm),
            f"<= {goal} s",
            om <= goal,
        )
    page.add()


def _memory(page: Page) -> None:
    idle = page.node["memory_idle"]
    samples = page.node["memory_cycles"]
    page.add("### Memory, descriptors, API connections")
    page.add()
    idle_when = (
        "each contender alone (the others stopped: the Python ones map the same interpreter "
        "and libraries, and each one's PSS would count only its share of them; the benchmark's "
        "own Python process, a gRPC client, still runs). Then, all running,"
        if page.node.get("memory_idle_alone")
        else "all contenders running (so each Python one's PSS counts only its share of the "
        "interpreter and libraries they all map); then"
    )
    page.add(
        f"Idle is 3 s after the slices are published, {idle_when} prepare/unprepare cycles at "
        "concurrency 1, 16 and 64, then bursts of 2,000 at 16, each sample 2 s after its burst. "
        "RSS and PSS are summed over the process tree; connections are established TCP "
        "connections to the API server. An agent in its container maps files nothing else on "
        "the node maps, so there its idle RSS is what the node pays for it."
    )
    page.add()
    page.add("| contender | cycles done | RSS | PSS | open fds | API connections |")
    page.add("|---|---|---|---|---|---|")
    for label, x in idle.items():
        page.add(
            f"| {label} | idle | {_mib(x['rss_kib'])} | {_mib(x['pss_kib'])} | {x['fds']} | "
            f"{x['api_connections']} |"
        )
    for label, rows in samples.items():
        for x in rows:
            page.add(
                f"| {label} | {x['cycles']} | {_mib(x['rss_kib'])} | {_mib(x['pss_kib'])} | "
                f"{x['fds']} | {x['api_connections']} |"
            )
    page.add()
    _imports(page)
    o, r = idle["ours"], page.ref("memory_idle")
    # PSS has the goal; RSS is shown beside it (what a node pays for an agent alone).
    for key, goal in (("pss_kib", f"<= {PSS_RATIO_GOAL}x"), ("rss_kib", "-")):
        ref_kib = r[key] if r else None
        met = (ref_kib is None or o[key] <= PSS_RATIO_GOAL * ref_kib) if key == "pss_kib" else None
        page.goal(
            f"idle {key[:3].upper()} (process tree)",
            _mib(o[key]),
            _mib(ref_kib) if ref_kib else "-",
            _ratio(o[key], ref_kib),
            goal,
            met,
        )
    mine = samples["ours"]
    theirs = page.ref("memory_cycles")
    growth = (mine[-1]["rss_kib"] - mine[0]["rss_kib"]) / 1024
    rgrowth = (theirs[-1]["rss_kib"] - theirs[0]["rss_kib"]) / 1024 if theirs else None
    page.goal(
        f"RSS growth, {mine[0]['cycles']} to {mine[-1]['cycles']} cycles",
        f"{growth:.1f} MiB",
        "-" if rgrowth is None else f"{rgrowth:.1f} MiB",
        "",
        f"<= {GROWTH_GOAL_MIB} MiB",
        growth <= GROWTH_GOAL_MIB,
    )
    for key, name in (("fds", "open fds"), ("api_connections", "API connections")):
        after = max(x[key] for x in mine)
        ref = f"{r[key]} / {max(x[key] for x in theirs)}" if r and theirs else "-"
        page.goal(
            f"{name}, idle / most after a burst",
            f"{o[key]} / {after}",
            ref,
            "",
            "bounded, equal",
            after == o[key],
        )


def _costs(page: Page) -> None:
    costs = page.node.get("costs")
    if not costs:
        return
    o, r = costs["ours"], page.ref("costs")
    page.goal(
        "fsyncs per prepare+unprepare (strace, fsync and fdatasync)",
        f"{o['fsyncs_per_cycle']:.2f}"
        + SNAPSHOT_NOTE.format(int(o["fsyncs_per_cycle"])) * (o["fsyncs_per_cycle"] % 1 > 0),
        f"{r['fsyncs_per_cycle']:.2f}" if r else "-",
        "",
        f"<= {FSYNC_GOAL}",
        # Whole syncs per cycle; the fraction is the journal's snapshot, once per ~1,000.
        int(o["fsyncs_per_cycle"]) <= FSYNC_GOAL,
    )
    page.goal(
        "driver CPU per claim, concurrency 1",
        f"{o['cpu_ms_per_claim']} ms",
        f"{r['cpu_ms_per_claim']} ms" if r else "-",
        _ratio(o["cpu_ms_per_claim"], r["cpu_ms_per_claim"] if r else None),
        "-",
        None,
    )


def _imports(page: Page) -> None:
    """What each dependency adds to the floor's memory, and the bound pydantic sets."""
    imports = page.node.get("imports")
    if not imports:
        return
    base = imports[FLOOR_LABEL]
    page.add(
        "Where the agent's idle memory over the floor's comes from (`bench/import_pss.py`): "
        "fresh interpreters, run as the image runs them, import what the floor imports, then "
        'each line\'s modules ("pydantic model" builds one small model, which loads the schema '
        "machinery every model needs), median of 3:"
    )
    page.add()
    page.add("| imports over the floor's | PSS | added |")
    page.add("|---|---|---|")
    for label, kib in imports.items():
        page.add(f"| {label} | {_mib(kib)} | {(kib - base) / 1024:+.1f} MiB |")
    page.add()
    pydantic = imports.get(PYDANTIC_MODEL)
    idle, ref = page.node["memory_idle"], page.ref("memory_idle")
    if pydantic is None or "floor" not in idle or not ref:
        return
    bound = idle["floor"]["pss_kib"] + pydantic - base
    page.add(
        "The driver keeps its settings, checkpoint and claim configuration in pydantic models "
        "(validated at the edges, by design). The floor's idle PSS plus what pydantic and one "
        f"model add is {_mib(bound)}, {_ratio(bound, ref['pss_kib'])} the reference's: the "
        "least a Python agent built that way holds idle here, before any code of its own."
    )
    page.add()


def _floor(page: Page) -> None:
    """Ours beside the Python floor: what the agent's work costs over Python's own price."""
    node = page.node
    if "floor" not in node["latency"]:
        return
    rows: list[tuple[str, Any, Any, Any, str]] = []
    refs = page.ref("latency") or [None] * len(node["latency"]["ours"])
    for o, f, r in zip(node["latency"]["ours"], node["latency"]["floor"], refs, strict=True):
        c = o["concurrency"]
        for key in (*RATIO_GOALS, "claims_per_s"):
            unit = "" if key == "claims_per_s" else " ms"
            name = key.replace("_ms", "").replace("_", " ")
            rows.append((f"{name} at {c}", o[key], f[key], r[key] if r else None, unit))
    if "costs" in node:
        ref_costs = page.ref("costs")
        rows.append(
            (
                "driver CPU per claim, concurrency 1",
                node["costs"]["ours"]["cpu_ms_per_claim"],
                node["costs"]["floor"]["cpu_ms_per_claim"],
                ref_costs["cpu_ms_per_claim"] if ref_costs else None,
                " ms",
            )
        )
    idle, ref_idle = node["memory_idle"], page.ref("memory_idle")
    rows.append(
        (
            "idle PSS",
            round(idle["ours"]["pss_kib"] / 1024, 1),
            round(idle["floor"]["pss_kib"] / 1024, 1),
            round(ref_idle["pss_kib"] / 1024, 1) if ref_idle else None,
            " MiB",
        )
    )
    start, ref_start = node["startup"], page.ref("startup")
    rows.append(
        (
            "registration socket",
            start["ours"]["registered_median_s"],
            start["floor"]["registered_median_s"],
            ref_start["registered_median_s"] if ref_start else None,
            " s",
        )
    )
    page.add("### Ours beside the Python floor")
    page.add()
    page.add(
        "`bench/floor_plugin.py` does for the same claims what a Python kubelet plugin cannot "
        "skip: the same protos, the same claim read (one GET), the same fdatasyncs, an atomic "
        "spec write, and nothing else (no checks, config, logs, metrics, status or health). "
        "It ran in the same interleaved rounds. Where ours is behind the reference, the floor "
        "is the measured bound for Python here; ours / floor is the price of the agent's work."
    )
    page.add()
    page.add("| figure | ours | floor | reference | ours / floor | floor / reference |")
    page.add("|---|---|---|---|---|---|")
    for name, o, f, r, unit in rows:
        page.add(
            f"| {name} | {o}{unit} | {f}{unit} | {'-' if r is None else f'{r}{unit}'} | "
            f"{_ratio(o, f)} | {_ratio(f, r)} |"
        )
    page.add()


def _profile(page: Page) -> None:
    prof = page.node.get("profile")
    if not prof or not prof.get("samples"):
        return
    page.add("## Where the agent's CPU goes")
    page.add()
    page.add(
        "py-spy sampled the agent (the thread holding the GIL, 250 Hz) over "
        f"{prof['cycles']} prepare+unprepare cycles of one claim at a time: "
        f"{prof['samples']} samples. A sample counts for an area "
        "when any frame of its stack is there, so the shares overlap."
    )
    page.add()
    page.add("| area | share of samples |")
    page.add("|---|---|")
    for area, share in prof["areas"].items():
        page.add(f"| {area} | {share}% |")
    page.add()
    page.add("Functions most often on top of the stack (own time):")
    page.add()
    page.add("| function | share |")
    page.add("|---|---|")
    for frame, share in prof["top"]:
        page.add(f"| `{frame}` | {share}% |")
    page.add()


def _calls(page: Page) -> None:
    """What ours and the floor call per claim, by component (``bench/call_profile.py``)."""
    calls = page.node.get("calls")
    if not calls or "ours" not in calls or "floor" not in calls:
        return
    o, f = calls["ours"], calls["floor"]
    page.add("### What the agent calls per claim, beside the floor")
    page.add()
    page.add(
        "Each of the two restarted under a deterministic profile (`bench/call_profile.py`: "
        "cProfile on the main thread's CPU clock) and profiled over "
        f"{o['cycles']} prepare+unprepare cycles of one claim at a time. The calls are counted, "
        "not sampled, and repeat from run to run to within a few (background work, such as a "
        "status write, lands in some cycles); a coroutine's resumption counts as a call, a C "
        "function for its caller's component; the profiled time is inflated by the profiler's "
        "cost per call, so it compares components, not the run's CPU per claim (above)."
    )
    page.add()
    page.add("| component | ours: calls | floor: calls | ours: profiled ms | floor: profiled ms |")
    page.add("|---|---|---|---|---|")
    for name, (oc, oms) in o["components"].items():
        fc, fms = f["components"].get(name, [0, 0])
        if oc or fc:
            page.add(f"| {name} | {oc:g} | {fc:g} | {oms:.3f} | {fms:.3f} |")
    page.add(
        f"| all | {o['calls']:g} | {f['calls']:g} | {o['profiled_ms']:.3f} | "
        f"{f['profiled_ms']:.3f} |"
    )
    page.add()
    more = {
        name: oc - f["components"].get(name, [0, 0])[0] for name, (oc, _) in o["components"].items()
    }
    extra = o["calls"] - f["calls"]
    largest = sorted(more, key=lambda n: -more[n])[:4]
    spread = (
        f"most of it in {largest[0]}"
        if more[largest[0]] > extra / 2
        else "no component holds half of it"
    )
    costs = page.node.get("costs", {})
    cpu = ""
    if "ours" in costs and "floor" in costs:
        ratio = _ratio(costs["ours"]["cpu_ms_per_claim"], costs["floor"]["cpu_ms_per_claim"])
        cpu = f"; its CPU per claim, unprofiled, is {ratio} the floor's"
    page.add(
        f"Ours makes {extra:,.0f} more calls per claim than the floor "
        f"({_ratio(o['calls'], f['calls'])}){cpu}: {spread}. The largest differences: "
        + ", ".join(f"{n} {more[n]:+,.0f}" for n in largest)
        + "."
    )
    page.add()


def _publisher(page: Page) -> None:
    pub = page.node["publisher"]
    st, rep, big = pub["steady_state"], pub["repair_s"], pub["big_node"]
    page.add("### Publisher (ours alone)")
    page.add()
    page.add("| measurement | result |")
    page.add("|---|---|")
    page.add(
        f"| API writes in a {st['seconds']:.0f} s steady state (agent's own request counter, "
        f"non-GET verbs) | {st['api_writes']} |"
    )
    page.add(f"| watch events on the node's slices in the same window | {st['slice_events']} |")
    page.add(
        f"| repair a deleted slice (delete -> all devices back) | median "
        f"{sorted(rep)[len(rep) // 2]} s ({', '.join(map(str, rep))}) |"
    )
    page.add(
        f"| {big['devices']} MIG devices (30 A100 x 7 1g.5gb): process start -> registration "
        f"socket | median {big['registered_median_s']} s |"
    )
    page.add(
        f"| {big['devices']} MIG devices: process start -> all published | median "
        f"{big['published_median_s']} s ({', '.join(map(str, big['published_s']))}) |"
    )
    page.add()


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


def render_scale(
    rows: list[dict[str, Any]],
    allocator: list[dict[str, Any]] | None = None,
    publish: list[dict[str, Any]] | None = None,
) -> str:
    """The scale benchmark's tables (``bench/bench_scale.py``), the allocator's per node
    (``bench/bench_allocator.py``) and what they show."""
    out = [
        "## The cluster at scale",
        "",
        "`bench/bench_scale.py`: worker processes, one per core, host the slice publishers of "
        "N simulated dgx-h100 nodes (the agent's `SliceController`, no kubelet) against a "
        "local control plane of their own for every row, so that no row waits on what an "
        "earlier one left in the API server; "
        "`minimal` is one bare device per GPU, `static` what the agent publishes by default, "
        "`dynamic` what it publishes with `--dynamic-mig` (every MIG placement, shared "
        "counters), `dynamic-1g` the same with `--mig-profiles=1g.10gb` (whole GPUs and their "
        "1g.10gb placements only), `dynamic-capacity` what it publishes with `--dynamic-mig "
        "--mig-layout=capacity` (each GPU one device shared by MIG slices). Time from the "
        "publishers' start until every device is "
        "visible, the bytes "
        "a watch on all ResourceSlices receives meanwhile (what the scheduler and every other "
        "slice watcher is sent), and the API server's resident memory before and 2 s after. "
        "Publisher CPU: what the worker processes used from the start of publishing "
        "until everything was visible, and per node.",
        "",
        "| nodes | layout | devices | slices | publish all | publisher CPU | watch bytes | "
        "API server RSS before -> after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("publish_all_s") is None:  # a row whose run ended before these were saved
            measured = "not recorded | - | - | - |"
        else:
            cpu = r.get("publisher_cpu_s")
            per_node = f" ({1000 * cpu / r['nodes']:.0f} ms/node)" if cpu is not None else ""
            measured = (
                f"{r['publish_all_s']} s | {'-' if cpu is None else f'{cpu} s'}{per_node} | "
                f"{r.get('watch_mib', '-')} MiB | "
                f"{r['apiserver_rss_before_mib']} -> {r['apiserver_rss_after_mib']} MiB |"
            )
        out.append(f"| {r['nodes']} | {r['layout']} | {r['devices']} | {r['slices']} | {measured}")
    scheduled = [(r, s) for r in rows for s in r.get("scheduling", [])]
    if scheduled:
        out += [
            "",
            "Then the scheduler, as upstream's scheduler_perf DRA workloads measure it: the "
            "nodes are made schedulable through their status (no kubelet), claims are created "
            "first, then one pod per claim as fast as the client can (32 creates in flight), "
            "and the scheduler allocates and binds. `gpu`: 1-GPU claims until every GPU is "
            "taken; `mig`: 1g.10gb MIG claims on the dynamic layouts (on `dynamic-capacity` a "
            "claim for 1 compute and 1 memory slice) until every GPU is carved "
            "full (7 per GPU) or 4,000 pods or 150 s. The scheduler's client limits are lifted "
            "(`--kube-api-qps=5000 --kube-api-burst=5000`), and the controller manager's, "
            "which releases the claims between workloads. Pods/s is bound pods over the time "
            "from the first create to the last binding; steady is the rate between the 10th and "
            "90th percent of bindings; latency is a pod's create request to the watch event "
            "that shows it bound. vs static: pods/s against whole-GPU pods on `static` in the "
            "same run (the goal for dynamic MIG: at least 50%). Carved: the allocations the "
            "node agents could honour, each claim's MIG device planned as the agent plans it "
            "(`plan_claim`, claims in creation order). CPU/pod: the CPU time the scheduler and "
            "the API server used while the workload ran, per bound pod (what the layout costs "
            "them, whichever of them limits the rate on this machine).",
            "",
            "| nodes | layout | claims | pods bound | pods/s | vs static | steady pods/s | "
            "creates/s | latency p50 | latency p99 | carved | scheduler CPU/pod | "
            "API server CPU/pod |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        static = {
            r["nodes"]: r["scheduling"][0]["pods_per_s"]
            for r in rows
            if r["layout"] == "static" and r.get("scheduling")
        }
        for r, s in scheduled:
            bound = f"{s['bound']} of {s['pods']}" + (" (cap reached)" if s["timed_out"] else "")
            base = static.get(r["nodes"])
            share = f"{s['pods_per_s'] / base:.0%}" if base and s["pods_per_s"] else "-"
            out.append(
                f"| {r['nodes']} | {r['layout']} | {s['workload']} | {bound} | "
                f"{s['pods_per_s']} | {share} | {s['steady_pods_per_s']} | {s['creates_per_s']} | "
                f"{s['latency_p50_s']} s | {s['latency_p99_s']} s | {s.get('carved', '-')} | "
                f"{_ms(s.get('scheduler_ms_per_pod'))} | {_ms(s.get('apiserver_ms_per_pod'))} |"
            )
    if allocator:
        out += ["", render_allocator(allocator)]
    if publish:
        out += ["", render_publish(publish)]
    if SCALE_FINDINGS.exists():
        out += ["", SCALE_FINDINGS.read_text().strip(), ""]
    return "\n".join(out)


def _cell(text: str) -> str:
    """``text`` as one table cell: on one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value} ms"


def render_publish(rows: list[dict[str, Any]]) -> str:
    """The publisher comparison (``bench/bench_publish.py``)."""
    out = [
        "### The agent's publisher against the upstream Go controller",
        "",
        "`bench/bench_publish.py` publishes the same pools twice, each time on a control "
        "plane of its own: with the agent's `SliceController` in worker processes (one per "
        "core) and with the "
        "upstream `resourceslice` controller Go kubelet plugins use (`testenv/cmd/slicepub`, "
        "one controller per node, started side by side in one process, client limits "
        "lifted). Each starts once its process is ready; time until every device is "
        "visible, CPU the publishers used meanwhile, writes and bytes written.",
        "",
        "| nodes | layout | publisher | publish all | CPU | writes | written |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['nodes']} | {r['layout']} | {r['publisher']} |"
        if "error" in r:
            out.append(f"{head} failed: {_cell(str(r['error']))} | | | |")
            continue
        out.append(
            f"{head} {r['publish_all_s']} s | "
            f"{r['cpu_s']} s | {r['writes']} | {r['write_mib']} MiB |"
        )
    return "\n".join(out)


def render_allocator(rows: list[dict[str, Any]]) -> str:
    """The allocator benchmark's table (``bench/bench_allocator.py``)."""
    out = [
        "### What one node costs the scheduler's allocator",
        "",
        "`bench/bench_allocator.py` runs the scheduler's own allocator package "
        "(k8s.io/dynamic-resource-allocation/structured, through `testenv/cmd/allocbench`) "
        "over one dgx-h100 node of each layout, as the DRA plugin calls it: a new allocator "
        "per pod, one `Allocate` per candidate node. A pod's cost on an N-node cluster is "
        "about N such calls. States: no device taken, half, all (whole GPUs for `gpu`, "
        "1g.10gb devices for `mig`). `dynamic-lean` is the placement layout with placements "
        "stripped to three attributes and their memory-slice counters: what per-device size "
        "alone is worth.",
        "",
        "| layout | devices | slices | claim | empty | half | full |",
        "|---|---|---|---|---|---|---|",
    ]
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        workload, state = r["case"].rsplit("-", 1)
        entry = table.setdefault((r["layout"], workload), {"row": r})
        entry[state] = f"{r['us_per_node']} us"
    for (layout, workload), e in table.items():
        r = e["row"]
        out.append(
            f"| {layout} | {r['devices']} | {r['slices']} | {workload} | "
            f"{e.get('empty', '-')} | {e.get('half', '-')} | {e.get('full', '-')} |"
        )
    return "\n".join(out)


#: What the recorded scale run shows, written from bench/results/scale.json.
SCALE_FINDINGS = Path(__file__).with_name("scale-findings.md")


def main(argv: list[str]) -> int:
    if not 2 <= len(argv) <= 5:
        print(
            "usage: report.py NODE_JSON CEL_TXT [SCALE_JSON [ALLOCATOR_JSON [PUBLISH_JSON]]]",
            file=sys.stderr,
        )
        return 2
    node = json.loads(Path(argv[0]).read_text())
    cel = Path(argv[1]).read_text()
    page = render(node, cel)
    if len(argv) >= 3:
        extra = [json.loads(Path(a).read_text()) for a in argv[3:]]
        scale = render_scale(json.loads(Path(argv[2]).read_text()), *extra)
        page = page.replace(CEL_INTRO, scale + "\n" + CEL_INTRO)
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
