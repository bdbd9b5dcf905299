"""The controller's decisions: from what exists for a domain to what to write, as data.

:func:`plan` is a pure function of one domain and what the controller observed for it (its
templates, DaemonSet, daemon pods and labelled nodes, the channels other domains hold). It
returns the actions that bring the cluster to the domain's desired state; the controller
only carries them out, in order. Running it again on the result returns no writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.computedomain.api import MAX_CHANNELS, ApiNames, Domain
from dra_driver.computedomain.objects import (
    DaemonSettings,
    channel_of,
    daemon_name,
    daemon_set,
    daemon_template,
    digest_of,
    workload_template,
)

JSON = dict[str, Any]
READY = "Ready"
NOT_READY = "NotReady"
TEMPLATES = "resourceclaimtemplates"
DAEMON_SETS = "daemonsets"


@dataclass(frozen=True)
class Made:
    """An object the controller may have made: its domain label and digest."""

    domain_uid: str
    digest: str = ""
    deleting: bool = False
    channel: int | None = None  # the channel a workload template gives

    @classmethod
    def of(cls, obj: JSON, names: ApiNames) -> Made:
        meta = obj.get("metadata") or {}
        return cls(
            domain_uid=str((meta.get("labels") or {}).get(names.domain_label, "")),
            digest=digest_of(obj),
            deleting=bool(meta.get("deletionTimestamp")),
            channel=channel_of(obj),
        )


@dataclass(frozen=True)
class DaemonPod:
    """One IMEX daemon pod of a domain."""

    node: str
    ip: str
    ready: bool
    problem: str = ""  # why it does not run, when the pod says (a crash, an image error)


@dataclass(frozen=True)
class Observed:
    """Everything the controller saw for one domain."""

    domain: Domain
    workload_template: Made | None = None  # the template named in the spec, whoever made it
    daemon_template: Made | None = None
    daemon_set: Made | None = None
    daemons: tuple[DaemonPod, ...] = ()
    #: Nodes labelled into the domain -> their NVLink clique ("" unknown).
    nodes: Mapping[str, str] = field(default_factory=dict)
    #: Channels held by the other live domains.
    taken_channels: frozenset[int] = frozenset()


# -- actions --------------------------------------------------------------------------


@dataclass(frozen=True)
class AddFinalizer:
    pass


@dataclass(frozen=True)
class RemoveFinalizer:
    pass


@dataclass(frozen=True)
class SetChannel:
    channel: int


@dataclass(frozen=True)
class Apply:
    """Create or update an object (server-side apply)."""

    resource: str
    namespace: str
    name: str
    body: JSON


@dataclass(frozen=True)
class Delete:
    resource: str
    namespace: str
    name: str


@dataclass(frozen=True)
class Unlabel:
    """Take a node out of the domain (remove its domain label)."""

    node: str


@dataclass(frozen=True)
class SetStatus:
    status: JSON


@dataclass(frozen=True)
class Emit:
    """An Event on the domain."""

    reason: str
    message: str
    warning: bool = True


Action = AddFinalizer | RemoveFinalizer | SetChannel | Apply | Delete | Unlabel | SetStatus | Emit


# -- the planner ----------------------------------------------------------------------


def free_channel(taken: frozenset[int]) -> int | None:
    """The lowest IMEX channel no other domain holds (None: all are taken)."""
    return next((c for c in range(MAX_CHANNELS) if c not in taken), None)


def plan(obs: Observed, names: ApiNames, settings: DaemonSettings) -> list[Action]:
    """The actions that bring one domain's objects to what it asks for."""
    domain = obs.domain
    if domain.deleting:
        return _tear_down(obs, names, settings)
    actions: list[Action] = []
    if names.finalizer not in domain.finalizers:
        actions.append(AddFinalizer())
    if domain.spec is None:
        status = _status(obs, ready_possible=False)
        return [
            *actions,
            *_status_actions(domain, status),
            Emit("InvalidSpec", f"{domain.key}: {domain.spec_error}"),
        ]
    channel = domain.channel
    if channel is not None and channel in obs.taken_channels:
        # Another domain holds it too: the channel is what keeps two domains apart.
        message = f"IMEX channel {channel} is held by another domain: this one gets another"
        actions.append(Emit("ChannelTaken", message))
        channel = None
    made = obs.workload_template
    if (
        channel is None
        and made is not None
        and made.domain_uid == domain.uid
        and made.channel is not None
        and made.channel not in obs.taken_channels
    ):
        # Given before, and its annotation lost or edited since (then read after a restart
        # as none): the domain's pods have that channel, so it keeps it while it is free.
        channel = made.channel
        actions.append(SetChannel(channel))
    if channel is None:
        channel = free_channel(obs.taken_channels)
        if channel is None:
            return [
                *actions,
                Emit("NoChannel", f"all {MAX_CHANNELS} IMEX channels are held by other domains"),
            ]
        actions.append(SetChannel(channel))
    actions += _templates(obs, channel, names, settings)
    actions += _status_actions(domain, _status(obs, ready_possible=True))
    # Repeated each round while it lasts; the controller posts an Event once per change.
    actions += [
        Emit("DaemonFailed", f"the IMEX daemon on node {p.node}: {p.problem}")
        for p in obs.daemons
        if p.problem
    ]
    return actions


def _templates(
    obs: Observed, channel: int, names: ApiNames, settings: DaemonSettings
) -> list[Action]:
    domain = obs.domain
    assert domain.spec is not None
    actions: list[Action] = []
    wanted = workload_template(domain, channel, names)
    found = obs.workload_template
    if found is not None and found.domain_uid != domain.uid:
        name = domain.spec.channel.resource_claim_template.name
        actions.append(
            Emit(
                "TemplateConflict",
                f"ResourceClaimTemplate {domain.namespace}/{name} exists and was not made for "
                "this domain: delete it or name another template in "
                "spec.channel.resourceClaimTemplate.name",
            )
        )
    else:
        actions += _write(TEMPLATES, domain.namespace, wanted, found)
    for resource, body, made in (
        (TEMPLATES, daemon_template(domain, names, settings), obs.daemon_template),
        (DAEMON_SETS, daemon_set(domain, names, settings), obs.daemon_set),
    ):
        actions += _write(resource, settings.namespace, body, made)
    return actions


def _write(resource: str, namespace: str, body: JSON, made: Made | None) -> list[Action]:
    """Make ``body``, or bring the object made before to it."""
    name = body["metadata"]["name"]
    if made is not None and made.digest == digest_of(body):
        return []
    if made is None or resource != TEMPLATES:
        return [Apply(resource, namespace, name, body)]
    # A claim template's spec is immutable: the API server refuses (422) an apply that
    # changes it, every round and before the status is written. It is deleted, and made
    # again once its deletion is seen.
    return [] if made.deleting else [Delete(resource, namespace, name)]


def _tear_down(obs: Observed, names: ApiNames, settings: DaemonSettings) -> list[Action]:
    """Delete what was made for a deleted domain; release it when nothing is left."""
    domain = obs.domain
    actions: list[Action] = []
    if (
        domain.spec is not None
        and obs.workload_template is not None
        and obs.workload_template.domain_uid == domain.uid
        and not obs.workload_template.deleting
    ):
        name = domain.spec.channel.resource_claim_template.name
        actions.append(Delete(TEMPLATES, domain.namespace, name))
    for resource, made in ((DAEMON_SETS, obs.daemon_set), (TEMPLATES, obs.daemon_template)):
        if made is not None and not made.deleting:
            actions.append(Delete(resource, settings.namespace, daemon_name(domain)))
    actions += [Unlabel(node) for node in sorted(obs.nodes)]
    ours = obs.workload_template is not None and obs.workload_template.domain_uid == domain.uid
    left = ours or obs.daemon_set or obs.daemon_template or obs.nodes or obs.daemons
    if not left and names.finalizer in domain.finalizers:
        actions.append(RemoveFinalizer())
    return actions


# -- status ---------------------------------------------------------------------------


def node_indexes(
    nodes: Sequence[tuple[str, str]], previous: Sequence[Mapping[str, Any]]
) -> dict[str, int]:
    """A stable index per node within its clique: ``(clique, index)`` is unique, and a node
    keeps the index it had while it stays in the same clique; a new one gets the lowest free.
    """
    before = {
        str(e.get("name")): (str(e.get("cliqueID", "")), e.get("index"))
        for e in previous
        if isinstance(e, Mapping)
    }
    taken: dict[str, set[int]] = {}
    out: dict[str, int] = {}
    for node, clique in nodes:
        old_clique, old_index = before.get(node, ("", None))
        used = taken.setdefault(clique, set())
        if old_clique == clique and isinstance(old_index, int) and old_index not in used:
            out[node] = old_index
            used.add(old_index)
    for node, clique in nodes:
        if node not in out:
            used = taken.setdefault(clique, set())
            index = next(i for i in range(len(nodes) + len(used) + 1) if i not in used)
            out[node] = index
            used.add(index)
    return out


def _status(obs: Observed, *, ready_possible: bool) -> JSON:
    """The domain's status: one entry per node in it, Ready when all its daemons are."""
    domain = obs.domain
    pods = {p.node: p for p in obs.daemons}
    members = sorted(set(obs.nodes) | set(pods))
    cliques = [(n, obs.nodes.get(n, "")) for n in members]
    previous = domain.status.get("nodes") or []
    indexes = node_indexes(cliques, previous if isinstance(previous, list) else [])
    entries = []
    for node, clique in cliques:
        pod = pods.get(node)
        entry = {
            "name": node,
            "ipAddress": pod.ip if pod else "",
            "cliqueID": clique,
            "index": indexes[node],
            "status": READY if pod and pod.ready else NOT_READY,
        }
        if pod and pod.problem:
            # Why the daemon does not run: the node's plugin gives up on it at once.
            entry["message"] = pod.problem
        entries.append(entry)
    ready = sum(1 for e in entries if e["status"] == READY)
    wanted = domain.spec.num_nodes if domain.spec else 0
    all_ready = bool(entries) and ready == len(entries) and ready >= wanted
    return {"status": READY if ready_possible and all_ready else NOT_READY, "nodes": entries}


def _status_actions(domain: Domain, status: JSON) -> list[Action]:
    """Write the status when it changed, with an Event for each change worth telling."""
    before = domain.status
    if before.get("status") == status["status"] and before.get("nodes", []) == status["nodes"]:
        return []
    actions: list[Action] = [SetStatus(status)]
    was = {
        str(e.get("name")): e.get("status")
        for e in before.get("nodes") or []
        if isinstance(e, Mapping)
    }
    for entry in status["nodes"]:
        if was.get(entry["name"]) == READY and entry["status"] != READY:
            actions.append(
                Emit("DaemonNotReady", f"the IMEX daemon on node {entry['name']} is not ready")
            )
    if before.get("status") != status["status"]:
        if status["status"] == READY:
            nodes = ", ".join(e["name"] for e in status["nodes"])
            actions.append(Emit("DomainReady", f"IMEX daemons ready on {nodes}", warning=False))
        elif before.get("status") == READY:
            actions.append(Emit("DomainNotReady", "not every IMEX daemon of the domain is ready"))
    return actions
