"""The ComputeDomain controller's planner, by tables: what it writes for what it saw."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from dra_driver.cel.lib_format import dns1123_subdomain
from dra_driver.computedomain.api import (
    NVIDIA,
    OWN,
    ApiNames,
    Domain,
    SpecError,
    parse_spec,
    read_domain,
)
from dra_driver.computedomain.crd import crd
from dra_driver.computedomain.objects import DaemonSettings, digest_of
from dra_driver.computedomain.planner import (
    DAEMON_SETS,
    TEMPLATES,
    Action,
    AddFinalizer,
    Apply,
    DaemonPod,
    Delete,
    Emit,
    Made,
    Observed,
    RemoveFinalizer,
    SetChannel,
    SetStatus,
    Unlabel,
    free_channel,
    node_indexes,
    plan,
)

SETTINGS = DaemonSettings(namespace="dra-driver", image="localhost/dra-driver:dev")
UID = "6d1c7e3a-0000-4000-8000-000000000001"


def domain(
    names: ApiNames = OWN,
    *,
    spec: Any = None,
    finalizers: tuple[str, ...] | None = None,
    channel: int | None = 0,
    status: dict[str, Any] | None = None,
    deleting: bool = False,
) -> Domain:
    meta: dict[str, Any] = {
        "name": "job",
        "namespace": "team",
        "uid": UID,
        "finalizers": list(finalizers if finalizers is not None else (names.finalizer,)),
    }
    if channel is not None:
        meta["annotations"] = {names.channel_annotation: str(channel)}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    obj = {
        "metadata": meta,
        "spec": spec
        if spec is not None
        else {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "job-channel"}}},
        "status": status or {},
    }
    return read_domain(obj, names)


def settled(d: Domain, names: ApiNames = OWN) -> Observed:
    """What the controller sees once everything for ``d`` was made."""
    from dra_driver.computedomain.objects import daemon_set, daemon_template, workload_template

    assert d.channel is not None
    return Observed(
        domain=d,
        workload_template=Made(d.uid, digest_of(workload_template(d, d.channel, names))),
        daemon_template=Made(d.uid, digest_of(daemon_template(d, names, SETTINGS))),
        daemon_set=Made(d.uid, digest_of(daemon_set(d, names, SETTINGS))),
    )


def kinds(actions: list[Action]) -> list[str]:
    out = []
    for a in actions:
        if isinstance(a, Apply | Delete):
            out.append(f"{type(a).__name__}:{a.resource}:{a.name}")
        elif isinstance(a, Emit):
            out.append(f"Emit:{a.reason}")
        else:
            out.append(type(a).__name__)
    return out


def test_a_new_domain_gets_a_finalizer_a_channel_its_templates_and_daemons() -> None:
    d = domain(finalizers=(), channel=None)
    actions = plan(Observed(domain=d, taken_channels=frozenset({0, 1, 3})), OWN, SETTINGS)
    assert kinds(actions) == [
        "AddFinalizer",
        "SetChannel",
        f"Apply:{TEMPLATES}:job-channel",
        f"Apply:{TEMPLATES}:imex-{UID}",
        f"Apply:{DAEMON_SETS}:imex-{UID}",
        "SetStatus",
    ]
    assert actions[1] == SetChannel(2)
    template = actions[2]
    assert isinstance(template, Apply) and template.namespace == "team"
    request = template.body["spec"]["spec"]["devices"]
    assert request["requests"][0]["exactly"]["deviceClassName"] == "imex-channel.gpu.dra.dev"
    params = request["config"][0]["opaque"]["parameters"]
    assert params == {
        "apiVersion": "gpu.dra.dev/v1alpha1",
        "kind": "ComputeDomainChannelConfig",
        "domainID": UID,
        "allocationMode": "Single",
        "channel": 2,
    }
    status = actions[-1]
    assert status == SetStatus({"status": "NotReady", "nodes": []})


def test_a_settled_domain_plans_nothing() -> None:
    d = domain(status={"status": "NotReady", "nodes": []})
    assert plan(settled(d), OWN, SETTINGS) == []


@pytest.mark.parametrize(
    ("change", "rewritten"),
    [
        (
            {
                "channel": {
                    "resourceClaimTemplate": {"name": "job-channel"},
                    "allocationMode": "All",
                }
            },
            ["job-channel"],
        ),
    ],
)
def test_a_changed_spec_rewrites_the_workload_template(
    change: dict[str, Any], rewritten: list[str]
) -> None:
    before = domain(status={"status": "NotReady", "nodes": []})
    after = domain(spec={"numNodes": 2, **change}, status={"status": "NotReady", "nodes": []})
    obs = replace(settled(before), domain=after)
    # Deleted first: a claim template's spec is immutable (see below), then made again.
    deleted = [a.name for a in plan(obs, OWN, SETTINGS) if isinstance(a, Delete)]
    assert deleted == rewritten
    gone = replace(obs, workload_template=None)
    applied = [a.name for a in plan(gone, OWN, SETTINGS) if isinstance(a, Apply)]
    assert applied == rewritten


def test_a_template_that_must_change_is_deleted_and_made_again() -> None:
    """A claim template's spec is immutable: an apply that changes it (the channel given again
    after the domain's annotation was edited, a driver upgrade that writes templates
    otherwise) is refused by the API server (422) every round, before the status is written,
    and the DaemonSet's apply after it never comes. Such a template is deleted, then made
    again once it is gone."""
    before = domain(channel=3, status={"status": "NotReady", "nodes": []})
    after = domain(channel=5, status={"status": "NotReady", "nodes": []})
    stale = settled(before).workload_template
    assert stale is not None
    old = replace(settled(before), domain=after, daemon_template=Made(UID, "0ld"))
    newer = replace(SETTINGS, image="localhost/dra-driver:next")
    assert kinds(plan(old, OWN, newer)) == [
        f"Delete:{TEMPLATES}:job-channel",
        f"Delete:{TEMPLATES}:imex-{UID}",
        f"Apply:{DAEMON_SETS}:imex-{UID}",
    ]
    # While they go, nothing is asked of them again.
    going = replace(
        settled(after),
        workload_template=replace(stale, deleting=True),
        daemon_template=Made(UID, "0ld", deleting=True),
    )
    assert plan(going, OWN, SETTINGS) == []
    gone = replace(settled(after), workload_template=None, daemon_template=None)
    actions = plan(gone, OWN, SETTINGS)
    assert kinds(actions) == [f"Apply:{TEMPLATES}:job-channel", f"Apply:{TEMPLATES}:imex-{UID}"]
    template = actions[0]
    assert isinstance(template, Apply)
    params = template.body["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params["channel"] == 5


def test_another_image_rolls_the_daemons() -> None:
    d = domain(status={"status": "NotReady", "nodes": []})
    newer = replace(SETTINGS, image="localhost/dra-driver:next")
    # The daemon claim template does not name the image: only the DaemonSet is rewritten.
    assert kinds(plan(settled(d), OWN, newer)) == [f"Apply:{DAEMON_SETS}:imex-{UID}"]


def test_a_channel_another_domain_holds_is_given_again() -> None:
    """Channels are unique among live domains: a domain whose annotation names one another
    domain holds (the controller counts it as taken only for the younger of the two) gets a
    free one, and its template, made with the old one, is made again."""
    d = domain(channel=3, status={"status": "NotReady", "nodes": []})
    actions = plan(replace(settled(d), taken_channels=frozenset({0, 3})), OWN, SETTINGS)
    assert kinds(actions) == ["Emit:ChannelTaken", "SetChannel", f"Delete:{TEMPLATES}:job-channel"]
    assert actions[1] == SetChannel(1)


def test_a_channel_lost_from_the_annotation_is_taken_from_the_template() -> None:
    """The annotation is where the controller keeps a domain's channel: edited to something
    that is no channel, it is read as none after a restart. The domain was then given the
    lowest free channel, likely not the one its pods have, and its template, made with the
    old one, changed under the job. The channel of the template made for it is kept."""
    from dra_driver.computedomain.objects import workload_template

    d = domain(channel=5, status={"status": "NotReady", "nodes": []})
    made = Made.of(workload_template(d, 5, OWN), OWN)
    assert made.channel == 5
    lost = replace(settled(d), domain=replace(d, channel=None), workload_template=made)
    assert plan(lost, OWN, SETTINGS) == [SetChannel(5)]
    # Held by another domain meanwhile: a free one, and the template made again with it.
    taken = replace(lost, taken_channels=frozenset({5}))
    assert kinds(plan(taken, OWN, SETTINGS)) == ["SetChannel", f"Delete:{TEMPLATES}:job-channel"]


@pytest.mark.parametrize(
    "config",
    [
        None,
        "x",
        [None],
        [{"opaque": "x"}],
        [{"opaque": {"parameters": "x"}}],
        [{"opaque": {"parameters": {"kind": "ComputeDomainChannelConfig", "channel": True}}}],
        [{"opaque": {"parameters": {"kind": "ComputeDomainChannelConfig", "channel": 2048}}}],
        [{"opaque": {"parameters": {"kind": "Other", "channel": 3}}}],
    ],
)
def test_a_template_of_any_shape_gives_no_channel(config: Any) -> None:
    """The template of the domain's name may be a user's: read, never raised on."""
    template = {
        "metadata": {"name": "job-channel"},
        "spec": {"spec": {"devices": {"config": config}}},
    }
    assert Made.of(template, OWN).channel is None


def test_a_template_of_someone_else_is_never_overwritten() -> None:
    d = domain(status={"status": "NotReady", "nodes": []})
    obs = replace(settled(d), workload_template=Made(domain_uid=""))
    actions = plan(obs, OWN, SETTINGS)
    assert kinds(actions) == ["Emit:TemplateConflict"]
    assert "team/job-channel" in actions[0].message  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"numNodes": -1, "channel": {"resourceClaimTemplate": {"name": "t"}}}, "spec.numNodes"),
        ({"numNodes": 1}, "spec.channel: Field required"),
        (
            {"channel": {"resourceClaimTemplate": {"name": "t"}, "allocationMode": "Some"}},
            "spec.channel.allocationMode",
        ),
        (
            {"channel": {"resourceClaimTemplate": {"name": "t"}}, "numNode": 2},
            "spec.numNode: unknown field",
        ),
        # A template name the API server refuses: applying it would fail forever, before the
        # status is written, with nothing on the domain saying why.
        (
            {"channel": {"resourceClaimTemplate": {"name": "Training_Channel"}}},
            "spec.channel.resourceClaimTemplate.name: not a valid object name",
        ),
    ],
)
def test_an_invalid_spec_is_reported_and_makes_nothing(spec: dict[str, Any], message: str) -> None:
    d = domain(spec=spec, channel=None)
    actions = plan(Observed(domain=d), OWN, SETTINGS)
    assert kinds(actions) == ["SetStatus", "Emit:InvalidSpec"]
    assert message in actions[-1].message  # type: ignore[union-attr]


TEMPLATE_NAMES = [
    ("t", True),
    ("training-channel", True),
    ("job.channel-1", True),
    ("0", True),
    ("a" * 253, True),
    ("a" * 254, False),
    ("", False),
    ("Training_Channel", False),
    ("Training", False),
    ("-channel", False),
    ("channel-", False),
    ("job..channel", False),
    (".channel", False),
    ("channel\n", False),
    ("chännel", False),
    ("job/channel", False),
]


@pytest.mark.parametrize(("name", "valid"), TEMPLATE_NAMES)
def test_the_template_name_is_an_object_name_for_the_planner_and_the_crd(
    name: str, valid: bool
) -> None:
    """The planner and the CRD's schema accept the same names: those the API server takes
    for a ResourceClaimTemplate (a lowercase RFC 1123 subdomain)."""
    assert (dns1123_subdomain(name) == []) == valid  # the API server's rule (apimachinery's)
    spec = {"channel": {"resourceClaimTemplate": {"name": name}}}
    try:
        parse_spec(spec)
    except SpecError:
        assert not valid
    else:
        assert valid
    schema = crd(OWN)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = schema["properties"]["spec"]["properties"]["channel"]["properties"][
        "resourceClaimTemplate"
    ]["properties"]["name"]
    # The API server's regular expressions (RE2) match like Python's search, but "$" matches
    # only at the very end: \Z here.
    pattern = rules["pattern"].removesuffix("$") + r"\Z"
    by_schema = (
        rules["minLength"] <= len(name) <= rules["maxLength"]
        and re.search(pattern, name) is not None
    )
    assert by_schema == valid


def test_no_free_channel_is_reported() -> None:
    d = domain(channel=None)
    actions = plan(Observed(domain=d, taken_channels=frozenset(range(2048))), OWN, SETTINGS)
    assert kinds(actions) == ["Emit:NoChannel"]
    assert free_channel(frozenset(range(2047))) == 2047


STATUS_CASES = [
    # (numNodes, daemons, labelled nodes, expected status, expected node statuses)
    (2, [], {}, "NotReady", {}),
    (2, [("n0", True)], {"n0": "c.1"}, "NotReady", {"n0": "Ready"}),
    (
        2,
        [("n0", True), ("n1", False)],
        {"n0": "c.1", "n1": "c.1"},
        "NotReady",
        {"n0": "Ready", "n1": "NotReady"},
    ),
    (
        2,
        [("n0", True), ("n1", True)],
        {"n0": "c.1", "n1": "c.1"},
        "Ready",
        {"n0": "Ready", "n1": "Ready"},
    ),
    # numNodes 0: ready when every daemon there is is ready
    (0, [("n0", True)], {"n0": "c.1"}, "Ready", {"n0": "Ready"}),
    # a labelled node whose daemon pod is not there yet
    (1, [("n0", True)], {"n0": "c.1", "n1": "c.1"}, "NotReady", {"n0": "Ready", "n1": "NotReady"}),
]


@pytest.mark.parametrize(("num", "daemons", "nodes", "overall", "per_node"), STATUS_CASES)
def test_status(
    num: int,
    daemons: list[tuple[str, bool]],
    nodes: dict[str, str],
    overall: str,
    per_node: dict[str, str],
) -> None:
    d = domain(
        spec={"numNodes": num, "channel": {"resourceClaimTemplate": {"name": "job-channel"}}}
    )
    pods = tuple(DaemonPod(n, f"10.0.0.{i}", r) for i, (n, r) in enumerate(daemons))
    obs = replace(settled(d), daemons=pods, nodes=nodes)
    [status] = [a for a in plan(obs, OWN, SETTINGS) if isinstance(a, SetStatus)]
    assert status.status["status"] == overall
    assert {e["name"]: e["status"] for e in status.status["nodes"]} == per_node
    for entry in status.status["nodes"]:
        assert entry["cliqueID"] == nodes.get(entry["name"], "")


def test_events_on_each_change_of_readiness() -> None:
    ready = {
        "status": "Ready",
        "nodes": [
            {
                "name": "n0",
                "ipAddress": "10.0.0.1",
                "cliqueID": "c.1",
                "index": 0,
                "status": "Ready",
            },
            {
                "name": "n1",
                "ipAddress": "10.0.0.2",
                "cliqueID": "c.1",
                "index": 1,
                "status": "Ready",
            },
        ],
    }
    d = domain(status=ready)
    nodes = {"n0": "c.1", "n1": "c.1"}
    both = (DaemonPod("n0", "10.0.0.1", True), DaemonPod("n1", "10.0.0.2", True))
    assert plan(replace(settled(d), daemons=both, nodes=nodes), OWN, SETTINGS) == []
    one_down = (both[0], DaemonPod("n1", "10.0.0.2", False, problem="CrashLoopBackOff: exit 1"))
    actions = plan(replace(settled(d), daemons=one_down, nodes=nodes), OWN, SETTINGS)
    assert kinds(actions) == [
        "SetStatus",
        "Emit:DaemonNotReady",
        "Emit:DomainNotReady",
        "Emit:DaemonFailed",
    ]
    assert "n1" in actions[1].message and "CrashLoopBackOff" in actions[3].message  # type: ignore[union-attr]
    # The node's entry says why, so the node's plugin stops waiting for that daemon.
    entries = {e["name"]: e for e in actions[0].status["nodes"]}  # type: ignore[union-attr]
    assert entries["n1"]["message"] == "CrashLoopBackOff: exit 1"
    assert "message" not in entries["n0"]
    not_ready = domain(status=actions[0].status)  # type: ignore[union-attr]
    back = plan(replace(settled(not_ready), daemons=both, nodes=nodes), OWN, SETTINGS)
    assert kinds(back) == ["SetStatus", "Emit:DomainReady"]
    assert back[1].warning is False  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("nodes", "previous", "expected"),
    [
        ([("a", "c1"), ("b", "c1")], [], {"a": 0, "b": 1}),
        # a node keeps its index; a new one takes the lowest free
        (
            [("a", "c1"), ("b", "c1")],
            [{"name": "b", "cliqueID": "c1", "index": 0}],
            {"a": 1, "b": 0},
        ),
        # indexes count per clique
        ([("a", "c1"), ("b", "c2")], [], {"a": 0, "b": 0}),
        # a node that moved clique gets a new index there
        (
            [("a", "c2"), ("b", "c2")],
            [
                {"name": "a", "cliqueID": "c1", "index": 5},
                {"name": "b", "cliqueID": "c2", "index": 0},
            ],
            {"a": 1, "b": 0},
        ),
        # two nodes claiming one index (a hand edit): the first keeps it
        (
            [("a", "c1"), ("b", "c1")],
            [
                {"name": "a", "cliqueID": "c1", "index": 0},
                {"name": "b", "cliqueID": "c1", "index": 0},
            ],
            {"a": 0, "b": 1},
        ),
    ],
)
def test_node_indexes(
    nodes: list[tuple[str, str]], previous: list[dict[str, Any]], expected: dict[str, int]
) -> None:
    assert node_indexes(nodes, previous) == expected


TEAR_DOWN = [
    # (what is left, expected actions)
    (
        {"workload": True, "daemonset": True, "daemon_template": True, "nodes": ["n1", "n0"]},
        [
            f"Delete:{TEMPLATES}:job-channel",
            f"Delete:{DAEMON_SETS}:imex-{UID}",
            f"Delete:{TEMPLATES}:imex-{UID}",
            "Unlabel",
            "Unlabel",
        ],
    ),
    ({"daemons": True}, []),  # pods still stopping: wait
    ({"foreign_template": True}, ["RemoveFinalizer"]),  # not ours: left alone
    ({}, ["RemoveFinalizer"]),
]


@pytest.mark.parametrize(("left", "expected"), TEAR_DOWN)
def test_a_deleted_domain_is_cleaned_up_then_released(
    left: dict[str, Any], expected: list[str]
) -> None:
    d = domain(deleting=True)
    workload = None
    if left.get("workload"):
        workload = Made(UID)
    elif left.get("foreign_template"):
        workload = Made("someone-else")
    obs = Observed(
        domain=d,
        workload_template=workload,
        daemon_set=Made(UID) if left.get("daemonset") else None,
        daemon_template=Made(UID) if left.get("daemon_template") else None,
        daemons=(DaemonPod("n0", "", False),) if left.get("daemons") else (),
        nodes={n: "" for n in left.get("nodes", [])},
    )
    actions = plan(obs, OWN, SETTINGS)
    assert kinds(actions) == expected
    assert [a.node for a in actions if isinstance(a, Unlabel)] == sorted(left.get("nodes", []))


def test_deletions_in_flight_are_not_repeated() -> None:
    d = domain(deleting=True)
    obs = Observed(domain=d, daemon_set=Made(UID, deleting=True))
    assert plan(obs, OWN, SETTINGS) == []


def test_compat_mode_names_the_nvidia_group_and_classes() -> None:
    d = domain(NVIDIA, finalizers=(), channel=None)
    actions = plan(Observed(domain=d), NVIDIA, SETTINGS)
    assert actions[0] == AddFinalizer()
    template = next(a for a in actions if isinstance(a, Apply) and a.name == "job-channel")
    devices = template.body["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"]["deviceClassName"] == (
        "compute-domain-default-channel.nvidia.com"
    )
    assert devices["config"][0]["opaque"]["driver"] == "compute-domain.nvidia.com"
    assert template.body["metadata"]["labels"] == {"resource.nvidia.com/computeDomain": UID}
    assert NVIDIA.path("team", "job", "status") == (
        "/apis/resource.nvidia.com/v1beta1/namespaces/team/computedomains/job/status"
    )


def test_the_daemon_set_runs_on_the_domains_nodes_only() -> None:
    d = domain(channel=None)
    applied = {
        a.resource: a.body
        for a in plan(Observed(domain=d), OWN, SETTINGS)
        if isinstance(a, Apply) and a.namespace == "dra-driver"
    }
    ds = applied[DAEMON_SETS]["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {"gpu.dra.dev/computeDomain": UID}
    assert ds["resourceClaims"] == [
        {"name": "imex-daemon", "resourceClaimTemplateName": f"imex-{UID}"}
    ]
    assert RemoveFinalizer() not in plan(Observed(domain=d), OWN, SETTINGS)
