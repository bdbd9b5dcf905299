"""The ComputeDomain controller: follows the domains and everything made for them, plans each
domain with :func:`~dra_driver.computedomain.planner.plan` and carries the plan out.

Five views are kept by list-and-watch (never polled): the domains, the ResourceClaimTemplates
(all of them: a template the user made under the name a domain asks for must be seen, so it
is never overwritten), and the driver namespace's daemon DaemonSets and pods, and the nodes
labelled into a domain. Any change to one of them queues its domain; every domain is also
planned again each ``resync`` seconds. One worker plans and writes, one domain at a time, so
two new domains never get the same channel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

import structlog

from dra_driver import resourceapi
from dra_driver.computedomain.api import CLIQUE_LABEL, KIND, ApiNames, Domain, read_domain
from dra_driver.computedomain.nodelabel import remove_domain_label
from dra_driver.computedomain.objects import DaemonSettings, daemon_name
from dra_driver.computedomain.planner import (
    DAEMON_SETS,
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
    plan,
)
from dra_driver.events import post_event
from dra_driver.kube import KubeClient, server_side_apply
from dra_driver.resourceslice.rawapi import CONNECTION_ERRORS, ApiError, RawApi, raise_for_status
from dra_driver.resourceslice.reflector import Reflector
from dra_driver.resourceslice.reporting import ApiErrorReporter

JSON = dict[str, Any]
FIELD_MANAGER = "dra-driver-compute-domain"
#: Waiting reasons of a container that will not start without someone acting.
STUCK = frozenset(
    {
        "CrashLoopBackOff",
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
    }
)
#: An identical Event is posted again only after this many seconds.
EVENT_REPEAT = 600.0
RETRY_DELAY = 2.0
#: Failures that leave a domain to the next round: the API server refused or was away.
RETRIED: tuple[type[BaseException], ...] = (ApiError, *CONNECTION_ERRORS)
#: The client errors that pass with time (a conflict, throttling): retried after RETRY_DELAY.
#: Any other 4xx refuses the request itself (invalid, forbidden, too large), and asking again
#: in 2 s gets the same answer: the domain waits for the next resync or change instead.
TRANSIENT_4XX = frozenset({409, 429})

log = structlog.get_logger(__name__)


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is the API server refusing a request, not a failure that passes."""
    return isinstance(exc, ApiError) and 400 <= exc.status < 500 and exc.status not in TRANSIENT_4XX


def _key(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


@dataclass
class View:
    """The objects of one kind, by namespace/name."""

    objects: dict[str, JSON] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)

    def listed(self, items: list[JSON]) -> None:
        self.objects = {_key(o): o for o in items}
        self.synced.set()

    def event(self, kind: str, obj: JSON) -> None:
        if kind == "DELETED":
            self.objects.pop(_key(obj), None)
        else:
            self.objects[_key(obj)] = obj


class DomainView(View):
    """The ComputeDomains, each also kept parsed: the controller reads them on every event."""

    def __init__(self, names: ApiNames) -> None:
        super().__init__()
        self._names = names
        self._parsed: dict[str, Domain] = {}

    def listed(self, items: list[JSON]) -> None:
        super().listed(items)
        self._parsed = {}
        for obj in items:
            if (domain := self._read(obj)) is not None:
                self._parsed[_key(obj)] = domain

    def event(self, kind: str, obj: JSON) -> None:
        super().event(kind, obj)
        domain = None if kind == "DELETED" else self._read(obj)
        if domain is None:
            self._parsed.pop(_key(obj), None)
        else:
            self._parsed[_key(obj)] = domain

    def _read(self, obj: JSON) -> Domain | None:
        """``obj`` read, or None when reading it fails. The views run in the reflector's
        callbacks, where an exception ends the controller (and its restart meets the same
        object): one domain that cannot be read is left alone, never the whole cluster."""
        try:
            return read_domain(obj, self._names)
        except Exception:
            log.exception("cannot read compute domain, skipping it", domain=_key(obj))
            return None

    def by_uid(self) -> dict[str, Domain]:
        """Every domain by UID."""
        return {d.uid: d for d in self._parsed.values()}


def _affinity_node(spec: JSON) -> str:
    """The node a DaemonSet pod not yet scheduled is meant for (its node affinity)."""
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in affinity.get("nodeSelectorTerms") or []:
        for field_term in term.get("matchFields") or []:
            values = field_term.get("values") or []
            if field_term.get("key") == "metadata.name" and len(values) == 1:
                return str(values[0])
    return ""


def daemon_pod(pod: JSON) -> DaemonPod:
    """One daemon pod as the planner sees it: where, its IP, ready or not, and why not."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = (conditions.get("Ready") or {}).get("status") == "True"
    problem = ""
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            problem = f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        problem = f"not scheduled: {scheduled.get('message', '')}"
    if status.get("phase") == "Failed":
        problem = f"failed: {status.get('message') or status.get('reason') or 'pod failed'}"
    return DaemonPod(
        node=str(spec.get("nodeName") or _affinity_node(spec)),
        ip=str(status.get("podIP") or ""),
        ready=ready,
        problem=problem,
    )


def observe(
    domain: Domain,
    *,
    templates: dict[str, JSON],
    daemon_sets: dict[str, JSON],
    pods: Iterable[JSON],
    nodes: Iterable[JSON],
    taken: frozenset[int],
    names: ApiNames,
    settings: DaemonSettings,
) -> Observed:
    """What the views hold for ``domain``: the planner's input."""
    label = names.domain_label

    def made(view: dict[str, JSON], key: str) -> Made | None:
        obj = view.get(key)
        return Made.of(obj, names) if obj is not None else None

    workload = None
    if domain.spec is not None:
        name = domain.spec.channel.resource_claim_template.name
        workload = made(templates, f"{domain.namespace}/{name}")
    daemons = tuple(
        daemon_pod(p)
        for p in pods
        if ((p.get("metadata") or {}).get("labels") or {}).get(label) == domain.uid
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    )
    members = {
        str(n["metadata"]["name"]): str(n["metadata"].get("labels", {}).get(CLIQUE_LABEL, ""))
        for n in nodes
        if (n.get("metadata") or {}).get("labels", {}).get(label) == domain.uid
    }
    own = f"{settings.namespace}/{daemon_name(domain)}"
    return Observed(
        domain=domain,
        workload_template=workload,
        daemon_template=made(templates, own),
        daemon_set=made(daemon_sets, own),
        daemons=tuple(d for d in daemons if d.node),
        nodes=members,
        taken_channels=taken,
    )


class DomainController:
    """Reconciles every ComputeDomain of the cluster (run it under leader election)."""

    def __init__(
        self,
        client: KubeClient,
        names: ApiNames,
        settings: DaemonSettings,
        *,
        resync: float = 30.0,
    ) -> None:
        self._client = client
        self._api = RawApi(client)
        self._names = names
        self._settings = settings
        self._resync = resync
        self.domains = DomainView(names)
        self.templates = View()
        self.daemon_sets = View()
        self.pods = View()
        self.nodes = View()
        self._pending: set[str] = set()
        self._wake = asyncio.Event()
        #: Domains with a retry scheduled: one each, however many rounds failed meanwhile.
        self._retrying: set[str] = set()
        #: Channels given out by this process, before the watch shows them (uid -> channel).
        self._assigned: dict[str, int] = {}
        self._posted: dict[tuple[str, str, str], float] = {}

    # -- following the cluster -------------------------------------------------------

    def _reflector(
        self, view: View, path: str, resource: str, label_selector: str = ""
    ) -> Reflector:
        def listed(items: list[JSON]) -> None:
            view.listed(items)
            self._queue_all()

        def event(kind: str, obj: JSON) -> None:
            view.event(kind, obj)
            self._queue_for(obj)

        return Reflector(
            lambda: self._api.list_objects(path, resource, label_selector=label_selector),
            lambda version, timeout: self._api.watch_objects(
                path, resource, "", version, timeout, label_selector=label_selector
            ),
            resource=resource,
            on_listed=listed,
            on_event=event,
            log=log,
            reporter=ApiErrorReporter(log),
        )

    def _queue_all(self) -> None:
        for obj in self.domains.objects.values():
            self._queue(str(obj["metadata"].get("uid", "")))
        # A domain deleted while the watch was away is gone from a relist without a DELETED
        # event: what is kept for it (its channel, held for no one otherwise) goes too.
        for uid in {*self._assigned, *(key[0] for key in self._posted)}:
            self._queue(uid)

    def _queue_for(self, obj: JSON) -> None:
        meta = obj.get("metadata") or {}
        uid = (meta.get("labels") or {}).get(self._names.domain_label)
        if obj.get("kind") == KIND or meta.get("uid") in self.domains.by_uid():
            self._queue(str(meta.get("uid", "")))
        elif obj.get("kind") == "ResourceClaimTemplate":
            if uid:
                self._queue(str(uid))
            # A template a domain names by its name (the user's own, or another domain's,
            # in the way): freed, it wakes the domain waiting for it.
            for domain in self.domains.by_uid().values():
                if domain.spec and _key(obj) == (
                    f"{domain.namespace}/{domain.spec.channel.resource_claim_template.name}"
                ):
                    self._queue(domain.uid)
        elif uid:
            self._queue(str(uid))
        else:
            # A node whose domain label went away: every domain might have lost it.
            self._queue_all()

    def _queue(self, uid: str) -> None:
        if uid:
            self._pending.add(uid)
            self._wake.set()

    def _retry(self, uid: str) -> None:
        self._retrying.discard(uid)
        self._queue(uid)

    # -- the loop --------------------------------------------------------------------

    async def run(self) -> None:
        """Follow the cluster and reconcile until cancelled."""
        ns = quote(self._settings.namespace, safe="")
        label = self._names.domain_label
        reflectors = [
            self._reflector(self.domains, self._names.path(), "computedomains"),
            self._reflector(
                self.templates,
                resourceapi.path(resourceapi.RESOURCE_CLAIM_TEMPLATES),
                "resourceclaimtemplates",
            ),
            self._reflector(
                self.daemon_sets, f"/apis/apps/v1/namespaces/{ns}/daemonsets", "daemonsets", label
            ),
            self._reflector(self.pods, f"/api/v1/namespaces/{ns}/pods", "pods", label),
            self._reflector(self.nodes, "/api/v1/nodes", "nodes", label),
        ]
        views = (self.domains, self.templates, self.daemon_sets, self.pods, self.nodes)
        async with asyncio.TaskGroup() as group:
            for reflector in reflectors:
                group.create_task(reflector.run())
            # Planning on a partial view could delete what a view not yet listed would show.
            await asyncio.gather(*(v.synced.wait() for v in views))
            log.info("compute domain controller synced", domains=len(self.domains.objects))
            group.create_task(self._resync_loop())
            await self._work()

    async def _resync_loop(self) -> None:
        while True:
            await asyncio.sleep(self._resync)
            self._queue_all()

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, set()
            domains = self.domains.by_uid()
            for uid in sorted(batch):
                domain = domains.get(uid)
                if domain is None:
                    self._assigned.pop(uid, None)
                    self._posted = {k: t for k, t in self._posted.items() if k[0] != uid}
                    continue
                try:
                    await self.reconcile(domain)
                except RETRIED as exc:
                    if refused(exc):
                        log.warning(
                            "reconcile refused, retried at the next resync",
                            domain=domain.key,
                            error=str(exc),
                        )
                        continue
                    log.warning("reconcile failed, will retry", domain=domain.key, error=str(exc))
                    # Every watch event and resync while the API server fails is another failed
                    # round: a retry of its own for each would add a retry loop per round.
                    if uid not in self._retrying:
                        self._retrying.add(uid)
                        asyncio.get_running_loop().call_later(RETRY_DELAY, self._retry, uid)

    def taken_channels(self, domain: Domain) -> frozenset[int]:
        """The channels every other domain holds (written, or given out by this process).

        Of two domains holding one channel (a manifest applied again with the annotation of
        the domain it was read from, a channel written whose answer was lost), the older keeps
        it: the younger's does not count as taken for it, the older's does for the younger.
        """
        domains = self.domains.by_uid()
        held = {uid: d.channel for uid, d in domains.items() if d.channel is not None}
        held.update(self._assigned)

        def age(uid: str) -> tuple[str, str]:
            other = domains.get(uid)
            return (other.created if other is not None else "", uid)

        mine = (domain.created, domain.uid)
        return frozenset(
            c
            for uid, c in held.items()
            if uid != domain.uid and (c != domain.channel or age(uid) < mine)
        )

    async def reconcile(self, domain: Domain) -> list[Action]:
        """Plan one domain and carry the plan out; returns the actions taken."""
        if domain.uid in self._assigned and domain.channel is None:
            domain = replace(domain, channel=self._assigned[domain.uid])
        observed = observe(
            domain,
            templates=self.templates.objects,
            daemon_sets=self.daemon_sets.objects,
            pods=self.pods.objects.values(),
            nodes=self.nodes.objects.values(),
            taken=self.taken_channels(domain),
            names=self._names,
            settings=self._settings,
        )
        actions = plan(observed, self._names, self._settings)
        for action in actions:
            # The next write's precondition is the version this one left.
            domain = await self._carry_out(domain, action)
        return actions

    # -- writing ---------------------------------------------------------------------

    async def _patch_domain(self, domain: Domain, patch: JSON, subresource: str = "") -> Domain:
        """Merge ``patch`` into the domain as read in ``domain`` and return it as written.

        The version read is a precondition (409 otherwise, retried on a fresh read): a
        domain deleted and made again under its name is never written with what was planned
        for the old one (its UID alone is no precondition on the status subresource), and a
        list the patch replaces (the finalizers) cannot have changed since it was read.
        """
        meta = {"uid": domain.uid}
        if domain.resource_version:
            meta["resourceVersion"] = domain.resource_version
        body = {**patch, "metadata": {**patch.get("metadata", {}), **meta}}
        path = self._names.path(domain.namespace, domain.name, subresource)
        response = await self._client.request(
            "PATCH", path, body=body, content_type="application/merge-patch+json"
        )
        raise_for_status(response, verb="patch", resource="computedomains", name=domain.key)
        written = read_domain(response.json(), self._names) if response.body else None
        if written is None or written.uid != domain.uid:
            return replace(domain, resource_version="")  # not told: the UID stays checked
        return written

    async def _carry_out(self, domain: Domain, action: Action) -> Domain:
        """Carry out one action; the domain as it stands after it."""
        names = self._names
        finalizers = list(domain.finalizers)
        match action:
            case AddFinalizer():
                added = [*finalizers, names.finalizer]
                return await self._patch_domain(domain, {"metadata": {"finalizers": added}})
            case RemoveFinalizer():
                rest = [f for f in finalizers if f != names.finalizer]
                domain = await self._patch_domain(domain, {"metadata": {"finalizers": rest}})
                log.info("compute domain released", domain=domain.key)
            case SetChannel(channel=channel):
                annotations = {names.channel_annotation: str(channel)}
                domain = await self._patch_domain(
                    domain, {"metadata": {"annotations": annotations}}
                )
                self._assigned[domain.uid] = channel
                log.info("imex channel given", domain=domain.key, channel=channel)
            case SetStatus(status=status):
                domain = await self._patch_domain(domain, {"status": status}, "status")
                log.info("compute domain status", domain=domain.key, status=status["status"])
            case Apply(resource=resource, namespace=ns, name=name, body=body):
                response = await server_side_apply(
                    self._client, _path(resource, ns, name), body, field_manager=FIELD_MANAGER
                )
                try:
                    raise_for_status(response, verb="apply", resource=resource, name=f"{ns}/{name}")
                except ApiError as exc:
                    if refused(exc):
                        # The status is written after the applies: without the Event
                        # nothing on the domain would say why it never becomes ready.
                        message = (
                            f"the API server refused {resource} {ns}/{name}: "
                            f"{exc.status} {exc.message}"
                        )
                        await self._emit(domain, "ApplyRefused", message, warning=True)
                    raise
                log.info("applied", domain=domain.key, resource=resource, name=f"{ns}/{name}")
            case Delete(resource=resource, namespace=ns, name=name):
                response = await self._client.request("DELETE", _path(resource, ns, name))
                if response.status != 404:
                    raise_for_status(
                        response, verb="delete", resource=resource, name=f"{ns}/{name}"
                    )
                log.info("deleted", domain=domain.key, resource=resource, name=f"{ns}/{name}")
            case Unlabel(node=node):
                await self._unlabel(domain, node)
            case Emit(reason=reason, message=message, warning=warning):
                await self._emit(domain, reason, message, warning)
        return domain

    async def _unlabel(self, domain: Domain, node: str) -> None:
        await remove_domain_label(self._client, self._names.domain_label, node, domain.uid)
        log.info("node left compute domain", domain=domain.key, node=node)

    async def _emit(self, domain: Domain, reason: str, message: str, warning: bool) -> None:
        key = (domain.uid, reason, message)
        now = time.monotonic()
        if now - self._posted.get(key, -EVENT_REPEAT) < EVENT_REPEAT:
            return
        self._posted[key] = now
        (log.warning if warning else log.info)(message, domain=domain.key, reason=reason)
        await post_event(
            self._client,
            kind=KIND,
            api_version=self._names.api_version,
            name=domain.name,
            namespace=domain.namespace,
            uid=domain.uid,
            reason=reason,
            message=message,
            event_type="Warning" if warning else "Normal",
            component="dra-driver-compute-domain",
        )


def _path(resource: str, namespace: str, name: str) -> str:
    if resource == DAEMON_SETS:
        ns, obj = quote(namespace, safe=""), quote(name, safe="")
        return f"/apis/apps/v1/namespaces/{ns}/daemonsets/{obj}"
    return resourceapi.path(resource, name, namespace=namespace)


async def run_controller(
    client: KubeClient,
    names: ApiNames,
    settings: DaemonSettings,
    *,
    identity: str,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Run the controller under leader election until cancelled or the lease is lost."""
    from dra_driver.leaderelection import LeaderElector

    elector = LeaderElector(
        client, namespace=settings.namespace, name="dra-driver-compute-domain", identity=identity
    )

    async def work() -> None:
        if on_started is not None:
            on_started()
        await DomainController(client, names, settings).run()

    await elector.run(work)
