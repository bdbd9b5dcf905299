"""The node side of ComputeDomains: prepares IMEX channel and daemon claims for the kubelet.

A channel claim brings its node into its domain: the node gets the domain's label, which
makes the controller's DaemonSet start the domain's IMEX daemon there. The claim's container
must not start before that daemon is ready, so:

- with binding conditions, the scheduler waits before binding the pod: this driver labels
  the node as soon as the channel is allocated, follows the domain's status and sets
  ``IMEXDaemonReady`` once the node's daemon is ready, or ``IMEXDaemonFailed`` when it is
  not within ``binding_wait`` (the scheduler then deallocates the claim and tries
  elsewhere, instead of a pod stuck in ContainerCreating);
- without them, prepare waits for the daemon (``ready_wait``, within the kubelet's 45 s) and
  fails with a message saying what it waits for; the kubelet calls again.

A node belongs to one domain at a time; a claim of another domain fails with a message
naming the domain that holds the node. When the last channel claim of a domain leaves the
node, so does the node's label (and with it the daemon). A domain being deleted takes no new
channel claims: its daemons are going away.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from dra_driver import resourceapi
from dra_driver.cdi.writer import remove, spec_file_name, write_atomic
from dra_driver.computedomain.api import ApiNames
from dra_driver.computedomain.channels import (
    NO_CLIQUE,
    DaemonEdits,
    cdi_device_id,
    claim_spec,
)
from dra_driver.computedomain.claimconfig import ImexClaim, ImexClaimError, read_claim
from dra_driver.computedomain.nodedevices import CHANNEL_DEVICE, DAEMON_FAILED, DAEMON_READY
from dra_driver.computedomain.nodelabel import node_path, remove_domain_label
from dra_driver.computedomain.nodestate import (
    CHECKPOINT,
    JOINING,
    Checkpoint,
    Joining,
    JoiningClaim,
    PreparedClaim,
    load,
    save,
)
from dra_driver.events import post_event
from dra_driver.kube import KubeClient, server_side_apply
from dra_driver.kubeletplugin.interfaces import (
    ClaimRef,
    ClaimToPrepare,
    PreparedDevice,
    PrepareResult,
    UnprepareResult,
)
from dra_driver.resourceslice.rawapi import CONNECTION_ERRORS, ApiError, raise_for_status

JSON = dict[str, Any]
#: Seconds prepare waits for the domain's daemon on the node (the kubelet gives 45 s).
READY_WAIT = 30.0
#: Seconds a pod waiting for binding may wait for the daemon (the scheduler gives 10 min).
BINDING_WAIT = 300.0
POLL = 1.0
#: The longest wait between two tries of a binding condition the API server failed.
CONDITION_RETRY_CAP = 30.0
#: The API server refused or could not be reached.
API_FAILURES: tuple[type[BaseException], ...] = (ApiError, *CONNECTION_ERRORS)
CLAIM_FAILURES: tuple[type[BaseException], ...] = (ImexClaimError, *API_FAILURES)
UNPREPARE_FAILURES: tuple[type[BaseException], ...] = (OSError, *API_FAILURES)

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class DaemonState:
    """The node's daemon of a domain, as the domain's status tells it."""

    ready: bool
    said: str
    #: The daemon cannot run (its pod says why, or the domain is gone): no use waiting.
    failed: bool = False


def daemon_state(domain: JSON | None, node: str) -> DaemonState:
    """The node's daemon of ``domain``: ready, waiting, or failed (pure)."""
    if domain is None:
        return DaemonState(False, "the domain is gone", failed=True)
    if deleting(domain):
        # The controller tears the daemons down but leaves the status as it was: a node
        # still listed Ready has no daemon for long.
        return DaemonState(False, "the domain is being deleted", failed=True)
    status = domain.get("status") or {}
    for entry in status.get("nodes") or []:
        if isinstance(entry, dict) and entry.get("name") == node:
            said = f"node {node}: {entry.get('status', 'NotReady')}"
            if entry.get("message"):
                return DaemonState(False, f"{said}, {entry['message']}", failed=True)
            return DaemonState(entry.get("status") == "Ready", said)
    return DaemonState(
        False, f"node {node} not in the domain's status yet (its daemon has not started)"
    )


def deleting(domain: JSON) -> bool:
    """Whether ``domain`` is being deleted (its controller is tearing its daemons down)."""
    return bool((domain.get("metadata") or {}).get("deletionTimestamp"))


def refuse_deleting(ref: ClaimRef, domain: JSON, key: str) -> None:
    """Raise for a channel of a domain being deleted: joining would put the node into a
    domain whose daemons are going away, and the claim's pod would run without one."""
    if deleting(domain):
        raise ImexClaimError(
            f"claim {ref}: compute domain {key} is being deleted; its channel cannot be used"
        )


def condition_status(
    ref: ClaimRef, driver: str, pool: str, device: str, kind: str, message: str, now: str
) -> JSON:
    """The apply configuration setting one binding condition of a claim's device (pure)."""
    reason = "DaemonReady" if kind == DAEMON_READY else "DaemonNotReady"
    return {
        "apiVersion": resourceapi.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        "status": {
            "devices": [
                {
                    "driver": driver,
                    "pool": pool,
                    "device": device,
                    "conditions": [
                        {
                            "type": kind,
                            "status": "True",
                            "reason": reason,
                            "message": message[:1000],
                            "lastTransitionTime": now,
                        }
                    ],
                }
            ]
        },
    }


class Domains:
    """Reads ComputeDomains by UID (a claim's config names its domain by UID)."""

    def __init__(self, client: KubeClient, names: ApiNames) -> None:
        self._client = client
        self._names = names
        self._names_by_uid: dict[str, tuple[str, str]] = {}

    async def get(self, namespace: str, uid: str) -> JSON | None:
        """The domain with ``uid`` in ``namespace`` (every namespace when empty), or None."""
        known = self._names_by_uid.get(uid)
        if known is not None and namespace in ("", known[0]):
            found = await self._read(self._names.path(*known))
            if found is not None and found["metadata"].get("uid") == uid:
                return found
        listing = await self._read(self._names.path(namespace)) or {}
        for item in listing.get("items") or []:
            meta = item["metadata"]
            if meta.get("uid") == uid:
                self._names_by_uid[uid] = (str(meta["namespace"]), str(meta["name"]))
                return dict(item)
        return None

    async def _read(self, path: str) -> JSON | None:
        response = await self._client.request("GET", path, timeout=10)
        if response.status == 404:
            return None
        raise_for_status(response, verb="get", resource="computedomains")
        data: JSON = response.json()
        return data


class Membership:
    """The node's domain label: which domain the node is in, joining and leaving."""

    def __init__(self, client: KubeClient, names: ApiNames, node: str) -> None:
        self._client = client
        self._key = names.domain_label
        self._node = node
        self._path = node_path(node)

    async def _meta(self) -> JSON:
        response = await self._client.request("GET", self._path, timeout=10)
        raise_for_status(response, verb="get", resource="nodes", name=self._node)
        meta: JSON = response.json()["metadata"]
        return meta

    async def join(self, uid: str, domain: str, *, attempts: int = 3) -> None:
        """Label the node into ``uid`` unless it is in another domain (then raise)."""
        for attempt in range(1, attempts + 1):
            meta = await self._meta()
            current = (meta.get("labels") or {}).get(self._key)
            if current == uid:
                return
            if current:
                raise ImexClaimError(
                    f"node {self._node} is in another compute domain ({current}); a node "
                    f"serves one domain at a time, so {domain} cannot use it until that "
                    "domain leaves"
                )
            # The resourceVersion makes this a compare-and-swap: two domains cannot both
            # join. A conflict (anything else updated the Node) reads the node again.
            patch = {
                "metadata": {
                    "labels": {self._key: uid},
                    "resourceVersion": meta["resourceVersion"],
                }
            }
            response = await self._client.request(
                "PATCH", self._path, body=patch, content_type="application/merge-patch+json"
            )
            if response.status != 409 or attempt == attempts:
                break
        raise_for_status(response, verb="patch", resource="nodes", name=self._node)
        log.info("node joined compute domain", node=self._node, domain=domain, domain_uid=uid)

    async def leave(self, uid: str) -> None:
        """Remove the node's label if it still names ``uid``."""
        await remove_domain_label(self._client, self._key, self._node, uid)
        log.info("node left compute domain", node=self._node, domain_uid=uid)


@dataclass
class _Joining:
    """A channel claim allocated here that joined the node to its domain and is not
    prepared yet (waiting for binding, or for its daemon in prepare)."""

    ref: ClaimRef
    domain: str
    devices: frozenset[str]
    task: asyncio.Task[None] | None = field(default=None)


class ImexDriver:
    """The kubelet plugin's driver for IMEX claims (and its binding watcher's)."""

    def __init__(
        self,
        client: KubeClient,
        names: ApiNames,
        node: str,
        *,
        state_dir: Path,
        cdi_root: Path,
        major: int | None,
        daemon: DaemonEdits = NO_CLIQUE,
        ready_wait: float = READY_WAIT,
        binding_wait: float = BINDING_WAIT,
        poll: float = POLL,
    ) -> None:
        self._client = client
        self._names = names
        self._driver = names.driver
        self._node = node
        self._checkpoint_path = state_dir / CHECKPOINT
        self._joining_path = state_dir / JOINING
        self._cdi_root = cdi_root
        self._major = major
        #: What a daemon claim's container gets from the node (its clique, the capability).
        self._daemon = daemon
        self._ready_wait = ready_wait
        self._binding_wait = binding_wait
        self._poll = poll
        self.domains = Domains(client, names)
        self.membership = Membership(client, names, node)
        self.checkpoint = Checkpoint()
        #: Kept in a file too: after a restart, the first list of allocated claims
        #: (:meth:`allocated`) still takes the node out of a domain whose joining claim
        #: went away meanwhile.
        self._joining: dict[str, _Joining] = {}
        self._reload()

    def _reload(self) -> None:
        """Take up what another plugin of the node wrote (a surge update runs the new one
        beside the old, on the same files): every call runs under the node lock both take,
        so the files are the truth when it starts. A follower of a claim the other plugin
        prepared or let go stops."""
        self.checkpoint = load(self._checkpoint_path, Checkpoint)
        claims = load(self._joining_path, Joining).claims
        for uid, known in list(self._joining.items()):
            j = claims.get(uid)
            if j is None or (j.domain, frozenset(j.devices)) != (known.domain, known.devices):
                del self._joining[uid]
                if known.task is not None:
                    known.task.cancel()
        for uid, j in claims.items():
            if uid not in self._joining:
                ref = ClaimRef(j.namespace, j.name, uid)
                self._joining[uid] = _Joining(ref, j.domain, frozenset(j.devices))

    # -- the kubelet's calls ---------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimToPrepare]) -> Mapping[str, PrepareResult]:
        """Prepare each claim (one failing fails only itself)."""
        await asyncio.to_thread(self._reload)
        results: dict[str, PrepareResult] = {}
        for claim in claims:
            try:
                results[claim.ref.uid] = await self._prepare(claim)
            except CLAIM_FAILURES as exc:
                log.warning("imex claim not prepared", claim=str(claim.ref), error=str(exc))
                results[claim.ref.uid] = ImexClaimError(str(exc))
        return results

    async def _prepare(self, claim: ClaimToPrepare) -> list[PreparedDevice]:
        ref = claim.ref
        recorded = self.checkpoint.claims.get(ref.uid)
        # The specs live in /var/run/cdi (a tmpfs), the checkpoint on disk: after a reboot
        # the kubelet prepares the claim again, and its spec must be written again.
        if recorded is not None and await asyncio.to_thread(self._spec_path(ref.uid).is_file):
            return self._prepared(recorded)
        imex = read_claim(claim, self._driver)
        for uid, other in self.checkpoint.claims.items():
            if uid != ref.uid and set(other.devices) & set(imex.devices):
                raise ImexClaimError(
                    f"claim {ref}: device {imex.devices[0]} is already prepared for claim "
                    f"{other.namespace}/{other.name} ({uid})"
                )
        # A workload may only join a domain of its own namespace; the daemons run in the
        # driver's namespace, for domains anywhere.
        where = ref.namespace if imex.kind == "channel" else ""
        domain = await self.domains.get(where, imex.domain)
        if domain is None:
            raise ImexClaimError(
                f"claim {ref}: no ComputeDomain with UID {imex.domain} in namespace "
                f"{where or 'any'} (deleted, or the claim was copied from another namespace)"
            )
        key = f"{domain['metadata']['namespace']}/{domain['metadata']['name']}"
        if imex.kind == "channel":
            refuse_deleting(ref, domain, key)
            # Until the claim is prepared or deallocated: a prepare that never succeeds (the
            # pod deleted while it waited) must not leave the node in the domain.
            await self._join(_Joining(ref, imex.domain, frozenset(imex.devices)), key)
            await self._wait_ready(ref, imex.domain, key)
        record = await asyncio.to_thread(self._write, ref, imex, key)
        # The checkpoint holds the claim now; it no longer waits to join.
        joined = await self._stop_joining(ref.uid)
        if joined is not None and joined.task is not None:
            joined.task.cancel()
        log.info(
            "imex claim prepared",
            claim=str(ref),
            claim_uid=ref.uid,
            domain=key,
            kind=imex.kind,
            channel=imex.channel if imex.kind == "channel" else None,
        )
        return self._prepared(record)

    async def _wait_ready(self, ref: ClaimRef, uid: str, key: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._ready_wait
        while True:
            state = daemon_state(await self.domains.get(ref.namespace, uid), self._node)
            if state.ready:
                return
            if not state.failed and not await asyncio.to_thread(self._daemon_prepared, uid):
                # The daemon pod's claim is prepared by this plugin, under the node lock this
                # call holds: waiting could only time out, holding that prepare back.
                raise ImexClaimError(
                    f"claim {ref}: the IMEX daemon of compute domain {key} has not started: "
                    f"its claim is not prepared on node {self._node} yet ({state.said}); "
                    "the kubelet tries again"
                )
            if state.failed or loop.time() >= deadline:
                waited = (
                    "cannot run" if state.failed else f"is not ready after {self._ready_wait:.0f} s"
                )
                raise ImexClaimError(
                    f"claim {ref}: the IMEX daemon of compute domain {key} on node "
                    f"{self._node} {waited} ({state.said}); the kubelet tries again"
                )
            await asyncio.sleep(self._poll)

    def _daemon_prepared(self, domain: str) -> bool:
        """Whether a daemon claim of ``domain`` is prepared here, its spec in place (after a
        reboot the record outlives the spec, and the daemon waits for its prepare again)."""
        return any(
            r.kind == "daemon" and r.domain == domain and self._spec_path(uid).is_file()
            for uid, r in self.checkpoint.claims.items()
        )

    async def _join(self, joining: _Joining, key: str) -> _Joining:
        """Record ``joining``, then label the node into its domain; the entry that stands is
        returned (the claim's earlier one, when it joins the same domain with the same
        devices). Recorded first: a crash right after the label was set still leaves a
        record that says whose label it is. A join refused because the node is in another
        domain forgets what it recorded; after any other failure the label may have been set,
        so the record stays (the claim's deallocation takes it, and the label if it is ours)."""
        uid = joining.ref.uid
        known = self._joining.get(uid)
        if known is not None and (known.domain, known.devices) == (
            joining.domain,
            joining.devices,
        ):
            joining = known
        else:
            known = None
            self._joining[uid] = joining
            await asyncio.to_thread(self._save_joining)
        try:
            await self.membership.join(joining.domain, key)
        except ImexClaimError:
            if known is None:
                await self._stop_joining(uid)
            raise
        return joining

    async def _stop_joining(self, claim_uid: str) -> _Joining | None:
        """Forget that ``claim_uid`` joins the node (the caller leaves if it must)."""
        joining = self._joining.pop(claim_uid, None)
        if joining is not None:
            await asyncio.to_thread(self._save_joining)
        return joining

    def _save_joining(self) -> None:
        claims = {
            uid: JoiningClaim(
                namespace=j.ref.namespace,
                name=j.ref.name,
                domain=j.domain,
                devices=sorted(j.devices),
            )
            for uid, j in self._joining.items()
        }
        save(self._joining_path, Joining(claims=claims))

    def _write(self, ref: ClaimRef, imex: ImexClaim, key: str) -> PreparedClaim:
        """Spec first, then the record: a crash between leaves a spec no record names,
        which the kubelet's retry rewrites and its unprepare removes (by claim UID)."""
        spec = claim_spec(self._driver, ref.uid, imex, key, self._major, self._daemon)
        write_atomic(self._spec_path(ref.uid), spec.to_json())
        record = PreparedClaim(
            namespace=ref.namespace,
            name=ref.name,
            kind=imex.kind,
            domain=imex.domain,
            devices=list(imex.devices),
            requests=list(imex.requests),
            cdi_ids=[cdi_device_id(self._driver, ref.uid, d) for d in imex.devices],
        )
        claims = {**self.checkpoint.claims, ref.uid: record}
        checkpoint = self.checkpoint.model_copy(update={"claims": claims})
        save(self._checkpoint_path, checkpoint)
        self.checkpoint = checkpoint
        return record

    def _spec_path(self, claim_uid: str) -> Path:
        vendor, _, cls = f"k8s.{self._driver}/claim".partition("/")
        return self._cdi_root / spec_file_name(vendor, cls, claim_uid)

    def _prepared(self, record: PreparedClaim) -> list[PreparedDevice]:
        return [
            PreparedDevice(
                request_names=(request,),
                pool_name=self._node,
                device_name=device,
                cdi_device_ids=(cdi_id,),
            )
            for device, request, cdi_id in zip(
                record.devices, record.requests, record.cdi_ids, strict=True
            )
        ]

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareResult]:
        """Remove each claim's spec and record; a domain whose last channel claim left
        the node takes its label off the node."""
        await asyncio.to_thread(self._reload)
        results: dict[str, UnprepareResult] = {}
        for ref in claims:
            try:
                # The spec (its pod is gone), then the node's domain, then the record: when
                # the leave fails, the record stays and the kubelet's next unprepare (it calls
                # again on an error) leaves again.
                record = self.checkpoint.claims.get(ref.uid)
                await asyncio.to_thread(remove, self._spec_path(ref.uid))
                if record is not None and record.kind == "channel":
                    await self._leave_if_unused(record.domain, without=ref.uid)
                await asyncio.to_thread(self._forget, ref.uid)
                results[ref.uid] = None
            except UNPREPARE_FAILURES as exc:
                log.warning("imex claim not unprepared", claim=str(ref), error=str(exc))
                results[ref.uid] = ImexClaimError(f"claim {ref}: {exc}")
        return results

    def _forget(self, claim_uid: str) -> None:
        record = self.checkpoint.claims.get(claim_uid)
        if record is not None:
            claims = {k: v for k, v in self.checkpoint.claims.items() if k != claim_uid}
            checkpoint = self.checkpoint.model_copy(update={"claims": claims})
            save(self._checkpoint_path, checkpoint)
            self.checkpoint = checkpoint
            log.info("imex claim unprepared", claim_uid=claim_uid, domain_uid=record.domain)

    def _holds(self, domain: str, *, without: str | None = None) -> bool:
        """Whether a channel claim other than ``without`` keeps the node in ``domain``:
        prepared (its unprepare leaves), or joining (allocated() leaves when it goes)."""
        return any(
            r.kind == "channel" and r.domain == domain and uid != without
            for uid, r in self.checkpoint.claims.items()
        ) or any(j.domain == domain and uid != without for uid, j in self._joining.items())

    async def _leave_if_unused(self, domain: str, *, without: str | None = None) -> None:
        """Take the node out of ``domain`` unless a claim other than ``without`` holds it."""
        if not self._holds(domain, without=without):
            await self.membership.leave(domain)

    # -- before binding --------------------------------------------------------------

    async def prepare_before_binding(self, claim: ClaimToPrepare) -> None:
        """A channel allocated here: join the node to the domain and follow the node's
        daemon until it is ready (then the scheduler binds the pod) or given up on."""
        await asyncio.to_thread(self._reload)
        ref = claim.ref
        try:
            imex = read_claim(claim, self._driver)
            domain = await self.domains.get(ref.namespace, imex.domain)
            if domain is None:
                raise ImexClaimError(
                    f"claim {ref}: no ComputeDomain with UID {imex.domain} in namespace "
                    f"{ref.namespace}"
                )
            key = f"{ref.namespace}/{domain['metadata']['name']}"
            refuse_deleting(ref, domain, key)
            joining = await self._join(_Joining(ref, imex.domain, frozenset(imex.devices)), key)
        except ImexClaimError as exc:
            await self._set_condition(ref, CHANNEL_DEVICE, DAEMON_FAILED, str(exc))
            return
        if joining.task is not None:
            joining.task.cancel()  # one follower per claim
        joining.task = asyncio.create_task(self._follow(joining, key))

    async def _follow(self, joining: _Joining, key: str) -> None:
        ref = joining.ref
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._binding_wait
        state = DaemonState(False, "")
        while loop.time() < deadline:
            try:
                found = await self.domains.get(ref.namespace, joining.domain)
                state = daemon_state(found, self._node)
            except API_FAILURES as exc:
                state = DaemonState(False, f"reading the domain failed: {exc}")
            if state.ready:
                message = f"the IMEX daemon of compute domain {key} on node {self._node} is ready"
                try:
                    await self._set_condition(ref, CHANNEL_DEVICE, DAEMON_READY, message)
                except API_FAILURES as exc:
                    # Unset, the pod would wait out the scheduler's binding timeout: the next
                    # poll sets it again.
                    _condition_failed(ref, DAEMON_READY, exc, self._poll)
                else:
                    log.info("imex channel ready for binding", claim=str(ref), domain=key)
                    return
            elif state.failed:
                break
            await asyncio.sleep(self._poll)
        waited = "cannot run" if state.failed else f"is not ready after {self._binding_wait:.0f} s"
        message = (
            f"the IMEX daemon of compute domain {key} on node {self._node} {waited} "
            f"({state.said}); the scheduler tries another node"
        )
        log.warning(
            "imex channel not ready for binding", claim=str(ref), domain=key, said=state.said
        )
        # Until it is set (or the claim deallocated cancels this): the scheduler moves on only
        # when it sees it, or after its own timeout.
        delay = self._poll
        for attempt in itertools.count():
            try:
                await self._set_condition(
                    ref, CHANNEL_DEVICE, DAEMON_FAILED, message, event=attempt == 0
                )
                return
            except API_FAILURES as exc:
                _condition_failed(ref, DAEMON_FAILED, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, CONDITION_RETRY_CAP)

    async def _set_condition(
        self, ref: ClaimRef, device: str, kind: str, message: str, *, event: bool = True
    ) -> None:
        """Set one binding condition; an API server that is away or overloaded raises (the
        caller tries again), any other refusal is logged (trying again would not help)."""
        body = condition_status(
            ref, self._driver, self._node, device, kind, message, resourceapi.api_time()
        )
        path = resourceapi.path(
            resourceapi.RESOURCE_CLAIMS, ref.name, namespace=ref.namespace, subresource="status"
        )
        if kind == DAEMON_FAILED and event:
            # The condition goes with the allocation; the Event stays for `kubectl describe`.
            await post_event(
                self._client,
                kind="ResourceClaim",
                name=ref.name,
                namespace=ref.namespace,
                uid=ref.uid,
                reason="IMEXDaemonFailed",
                message=message,
                component=self._driver,
            )
        response = await server_side_apply(self._client, path, body, field_manager=self._driver)
        if response.status == 429 or response.status >= 500:
            raise_for_status(response, verb="apply", resource="resourceclaims", name=ref.name)
        if not response.ok and response.status != 404:
            log.error(
                "setting a binding condition failed",
                claim=str(ref),
                condition=kind,
                status=response.status,
                error=json.loads(response.body or b"{}").get("message", "")[:300],
            )

    async def allocated(self, claims: Mapping[str, frozenset[str]]) -> None:
        """The claims allocated from this node's pool now: a channel that waited for binding
        and is no longer allocated stops waiting; its domain may leave the node. A leave the
        API server failed is raised after the others were tried (the watcher calls again)."""
        await asyncio.to_thread(self._reload)
        failed: BaseException | None = None
        for uid, joining in list(self._joining.items()):
            if claims.get(uid) == joining.devices and uid not in self.checkpoint.claims:
                continue
            if joining.task is not None:
                joining.task.cancel()
            if uid not in self.checkpoint.claims:
                try:
                    await self._leave_if_unused(joining.domain, without=uid)
                except API_FAILURES as exc:
                    # The record stays until the node has left: the watcher's next call (or
                    # a restarted plugin's first) leaves again.
                    log.warning(
                        "leaving compute domain failed", claim=str(joining.ref), error=str(exc)
                    )
                    failed = failed or exc
                    continue
            await self._stop_joining(uid)
        if failed is not None:
            raise failed

    async def close(self) -> None:
        """Stop following domains (on shutdown)."""
        tasks = [j.task for j in self._joining.values() if j.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _condition_failed(ref: ClaimRef, condition: str, exc: BaseException, retry_in: float) -> None:
    log.warning(
        "setting a binding condition failed, retrying",
        claim=str(ref),
        condition=condition,
        error=str(exc),
        retry_in=retry_in,
    )
