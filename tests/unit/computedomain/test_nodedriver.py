"""The IMEX node driver against an in-memory API: joining, waiting, binding, leaving."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dra_driver.computedomain.api import OWN
from dra_driver.computedomain.nodedriver import ImexDriver
from dra_driver.kube import Response
from dra_driver.kubeletplugin.interfaces import ClaimRef, ClaimToPrepare
from dra_driver.resourceslice.rawapi import ApiError

NODE = "n0"
UID = "d0000000-0000-4000-8000-000000000001"
OTHER = "d0000000-0000-4000-8000-000000000002"
LABEL = OWN.domain_label


class FakeApi:
    """Just the requests the driver makes: the node, the domains, claim status, events."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}
        self.version = 1
        self.domains: dict[tuple[str, str], dict[str, Any]] = {}
        self.conditions: list[tuple[str, str, str]] = []  # claim, type, message
        self.events: list[tuple[str, str]] = []  # reason, message
        # Label removals refused with a 500 (any transient refusal): the next N.
        self.refuse_label_removals = 0

    def domain(self, namespace: str, name: str, uid: str, ready: bool | None) -> None:
        nodes = (
            [] if ready is None else [{"name": NODE, "status": "Ready" if ready else "NotReady"}]
        )
        self.domains[(namespace, name)] = {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"nodes": nodes},
        }

    async def request(self, method: str, path: str, **kw: Any) -> Response:
        body = kw.get("body")
        if path == f"/api/v1/nodes/{NODE}":
            return self._node(method, body, kw.get("content_type", ""))
        if "/computedomains" in path:
            return self._domains(path)
        if path.endswith("/status"):
            for device in body["status"]["devices"]:
                for c in device["conditions"]:
                    self.conditions.append((body["metadata"]["name"], c["type"], c["message"]))
            return _ok({})
        if path.endswith("/events"):
            self.events.append((body["reason"], body["message"]))
            return _ok({})
        raise AssertionError(f"unexpected {method} {path}")

    def _node(self, method: str, body: Any, content_type: str) -> Response:
        refused = Response(500, {}, b'{"message": "etcdserver: request timed out"}')
        if content_type == "application/json-patch+json" and self.refuse_label_removals:
            self.refuse_label_removals -= 1
            return refused
        if method == "GET":
            meta = {"name": NODE, "labels": dict(self.labels), "resourceVersion": str(self.version)}
            return _ok({"metadata": meta})
        if content_type == "application/json-patch+json":
            test, _ = body
            if self.labels.get(LABEL) != test["value"]:
                return Response(422, {}, b"{}")
            del self.labels[LABEL]
        else:
            if body["metadata"]["resourceVersion"] != str(self.version):
                return Response(409, {}, b"{}")
            self.labels.update(body["metadata"]["labels"])
        self.version += 1
        return _ok({})

    def _domains(self, path: str) -> Response:
        parts = path.split("/")
        if parts[-1] == "computedomains":
            namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts else ""
            items = [d for (ns, _), d in self.domains.items() if namespace in ("", ns)]
            return _ok({"items": items})
        namespace, name = parts[parts.index("namespaces") + 1], parts[-1]
        found = self.domains.get((namespace, name))
        return _ok(found) if found else Response(404, {}, b"{}")


def _ok(data: Any) -> Response:
    return Response(200, {}, json.dumps(data).encode())


def _claim(name: str, device: str, domain: str = UID, namespace: str = "team") -> ClaimToPrepare:
    kind = "ComputeDomainChannelConfig" if device == "channel-0" else "ComputeDomainDaemonConfig"
    params: dict[str, Any] = {
        "apiVersion": "gpu.dra.dev/v1alpha1",
        "kind": kind,
        "domainID": domain,
    }
    if device == "channel-0":
        params["channel"] = 5
    return ClaimToPrepare(
        ref=ClaimRef(namespace, name, f"uid-{name}"),
        claim={},
        results=({"request": "r", "driver": OWN.driver, "pool": NODE, "device": device},),
        config=({"requests": ["r"], "opaque": {"driver": OWN.driver, "parameters": params}},),
    )


def _driver(api: FakeApi, tmp_path: Path, **kw: Any) -> ImexDriver:
    return ImexDriver(
        api,  # type: ignore[arg-type]
        OWN,
        NODE,
        state_dir=tmp_path / "state",
        cdi_root=tmp_path / "cdi",
        major=234,
        poll=0.01,
        **kw,
    )


async def test_a_channel_joins_the_node_and_gets_the_domains_channel(tmp_path: Path) -> None:
    api = FakeApi()
    api.domain("team", "train", UID, ready=True)
    driver = _driver(api, tmp_path)
    [result] = (await driver.prepare([_claim("w", "channel-0")])).values()
    assert not isinstance(result, Exception), result
    assert api.labels == {LABEL: UID}
    [spec_file] = (tmp_path / "cdi").iterdir()
    spec = json.loads(spec_file.read_text())
    [node] = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert (node["major"], node["minor"]) == (234, 5)
    # Prepared again (the kubelet repeats calls): the same answer, nothing new.
    assert (await driver.prepare([_claim("w", "channel-0")]))["uid-w"] == result
    # A restarted driver knows the claim from its checkpoint.
    assert "uid-w" in _driver(api, tmp_path).checkpoint.claims
    # Unprepared: the spec goes, and the node leaves the domain with its last channel.
    assert await driver.unprepare([ClaimRef("team", "w", "uid-w")]) == {"uid-w": None}
    assert not list((tmp_path / "cdi").iterdir())
    assert api.labels == {}


async def test_prepare_waits_for_the_daemon_then_says_what_it_waits_for(tmp_path: Path) -> None:
    api = FakeApi()
    api.domain("team", "train", UID, ready=False)
    driver = _driver(api, tmp_path, ready_wait=0.05)
    await driver.prepare([_claim("d", "daemon-0", namespace="dra")])  # its pod starts
    [result] = (await driver.prepare([_claim("w", "channel-0")])).values()
    assert isinstance(result, Exception)
    assert "IMEX daemon of compute domain team/train on node n0 is not ready" in str(result)
    assert "node n0: NotReady" in str(result)
    assert api.labels == {LABEL: UID}  # joined: that is what starts the daemon
    assert [p.name for p in (tmp_path / "cdi").iterdir()] == [
        "k8s.compute-domain.gpu.dra.dev-claim_uid-d.json"  # the daemon's only
    ]
    # Still allocated: the node stays in the domain while the kubelet tries again.
    await driver.allocated({"uid-w": frozenset({"channel-0"})})
    assert api.labels == {LABEL: UID}
    # The pod went before its daemon was ready: the node leaves the domain.
    await driver.allocated({})
    assert api.labels == {}


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("other-domain", "node n0 is in another compute domain"),
        ("other-namespace", "no ComputeDomain with UID"),
        ("no-domain", "no ComputeDomain with UID"),
    ],
)
async def test_a_channel_the_node_cannot_serve_fails_with_a_message(
    tmp_path: Path, setup: str, message: str
) -> None:
    api = FakeApi()
    if setup == "other-domain":
        api.labels[LABEL] = OTHER
        api.domain("team", "train", UID, ready=True)
    if setup == "other-namespace":
        api.domain("elsewhere", "train", UID, ready=True)
    result = (await _driver(api, tmp_path).prepare([_claim("w", "channel-0")]))["uid-w"]
    assert isinstance(result, Exception) and message in str(result)
    assert api.labels.get(LABEL) == (OTHER if setup == "other-domain" else None)


async def test_a_daemon_claim_finds_its_domain_in_any_namespace(tmp_path: Path) -> None:
    api = FakeApi()
    api.domain("team", "train", UID, ready=None)
    result = (await _driver(api, tmp_path).prepare([_claim("d", "daemon-0", namespace="dra")]))[
        "uid-d"
    ]
    assert not isinstance(result, Exception), result
    assert api.labels == {}  # a daemon does not join: it runs where the node joined


async def test_binding_waits_for_the_daemon_and_gives_up_in_time(tmp_path: Path) -> None:
    api = FakeApi()
    api.domain("team", "train", UID, ready=False)
    driver = _driver(api, tmp_path, binding_wait=0.1)
    await driver.prepare_before_binding(_claim("w", "channel-0"))
    assert api.labels == {LABEL: UID}
    await asyncio.sleep(0.05)
    api.domain("team", "train", UID, ready=True)
    await _settled(driver)
    assert [(c, t) for c, t, _ in api.conditions] == [("w", "IMEXDaemonReady")]

    late = FakeApi()
    late.domain("team", "train", UID, ready=False)
    driver = _driver(late, tmp_path / "late", binding_wait=0.05)
    await driver.prepare_before_binding(_claim("w", "channel-0"))
    await _settled(driver)
    [(_, kind, message)] = late.conditions
    assert kind == "IMEXDaemonFailed" and "not ready after" in message
    assert [r for r, _ in late.events] == ["IMEXDaemonFailed"]
    # The scheduler deallocates the claim: the node leaves the domain.
    await driver.allocated({})
    assert late.labels == {}


async def test_binding_gives_up_at_once_on_a_daemon_that_cannot_run(tmp_path: Path) -> None:
    api = FakeApi()
    api.domain("team", "train", UID, ready=False)
    api.domains[("team", "train")]["status"]["nodes"][0]["message"] = "ImagePullBackOff: no image"
    driver = _driver(api, tmp_path, binding_wait=60)
    await driver.prepare_before_binding(_claim("w", "channel-0"))
    await asyncio.wait_for(_settled(driver), 5)
    [(_, kind, message)] = api.conditions
    assert kind == "IMEXDaemonFailed" and "cannot run" in message
    assert "ImagePullBackOff: no image" in message
    # Prepare (no binding conditions) says the same at once instead of waiting.
    result = await _driver(api, tmp_path / "p", ready_wait=60).prepare([_claim("v", "channel-0")])
    assert "cannot run" in str(result["uid-v"])


async def test_binding_refused_at_once_on_a_node_of_another_domain(tmp_path: Path) -> None:
    api = FakeApi()
    api.labels[LABEL] = OTHER
    api.domain("team", "train", UID, ready=True)
    await _driver(api, tmp_path).prepare_before_binding(_claim("w", "channel-0"))
    [(_, kind, message)] = api.conditions
    assert kind == "IMEXDaemonFailed" and "in another compute domain" in message
    assert api.labels == {LABEL: OTHER}


async def test_a_failed_leave_is_retried_by_the_kubelets_next_unprepare(tmp_path: Path) -> None:
    api = FakeApi()
    api.domain("team", "train", UID, ready=True)
    driver = _driver(api, tmp_path)
    [result] = (await driver.prepare([_claim("w", "channel-0")])).values()
    assert not isinstance(result, Exception), result
    api.refuse_label_removals = 1
    ref = ClaimRef("team", "w", "uid-w")
    first = await driver.unprepare([ref])
    assert isinstance(first["uid-w"], Exception)  # the kubelet calls again
    assert api.labels == {LABEL: UID}
    # The record stays until the node has left: the retry leaves.
    assert await driver.unprepare([ref]) == {"uid-w": None}
    assert api.labels == {}
    assert not list((tmp_path / "cdi").iterdir())
    assert not _driver(api, tmp_path).checkpoint.claims


async def test_unprepare_keeps_the_node_in_a_domain_another_claim_joins(tmp_path: Path) -> None:
    """The claim deallocated and its device given to a new claim of the same domain before
    the kubelet unprepared the old one: the node stays for the new one."""
    api = FakeApi()
    api.domain("team", "train", UID, ready=True)
    driver = _driver(api, tmp_path, binding_wait=60)
    await driver.prepare([_claim("w", "channel-0")])
    api.domain("team", "train", UID, ready=False)
    await driver.prepare_before_binding(_claim("v", "channel-0"))
    assert await driver.unprepare([ClaimRef("team", "w", "uid-w")]) == {"uid-w": None}
    assert api.labels == {LABEL: UID}
    await driver.allocated({})  # the new claim went too: now the node leaves
    assert api.labels == {}


async def test_a_channel_of_a_domain_being_deleted_is_not_prepared(tmp_path: Path) -> None:
    """The controller tears a deleted domain down but leaves its status as it was: the
    stale Ready must not join the node or give a pod a channel without a daemon."""
    api = FakeApi()
    api.domain("team", "train", UID, ready=True)
    api.domains[("team", "train")]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    driver = _driver(api, tmp_path, ready_wait=60)
    [result] = (await driver.prepare([_claim("w", "channel-0")])).values()
    assert isinstance(result, Exception)
    assert "compute domain team/train is being deleted" in str(result)
    assert api.labels == {}
    assert not (tmp_path / "cdi").exists() or not list((tmp_path / "cdi").iterdir())

    await driver.prepare_before_binding(_claim("v", "channel-0"))
    [(claim, kind, message)] = api.conditions
    assert (claim, kind) == ("v", "IMEXDaemonFailed") and "is being deleted" in message
    assert api.labels == {}


async def test_binding_gives_up_at_once_on_a_domain_deleted_while_it_waits(
    tmp_path: Path,
) -> None:
    api = FakeApi()
    api.domain("team", "train", UID, ready=False)
    driver = _driver(api, tmp_path, binding_wait=60)
    await driver.prepare_before_binding(_claim("w", "channel-0"))
    api.domain("team", "train", UID, ready=True)
    api.domains[("team", "train")]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    await asyncio.wait_for(_settled(driver), 5)
    [(_, kind, message)] = api.conditions
    assert kind == "IMEXDaemonFailed" and "the domain is being deleted" in message


async def test_a_restarted_driver_still_leaves_for_a_claim_that_went_while_it_was_down(
    tmp_path: Path,
) -> None:
    """The node joined for a channel waiting for binding; the plugin restarted, and the claim
    was deallocated meanwhile. The first list of allocated claims takes the node out."""
    api = FakeApi()
    api.domain("team", "train", UID, ready=False)
    driver = _driver(api, tmp_path, binding_wait=60)
    await driver.prepare_before_binding(_claim("w", "channel-0"))
    assert api.labels == {LABEL: UID}
    await driver.close()
    restarted = _driver(api, tmp_path, binding_wait=60)
    # Still allocated: the node stays for it.
    await restarted.allocated({"uid-w": frozenset({"channel-0"})})
    assert api.labels == {LABEL: UID}
    await restarted.allocated({})
    assert api.labels == {}
    # And it is forgotten for good: another restart has nothing to leave.
    assert not _driver(api, tmp_path)._joining


async def test_a_restarted_driver_knows_the_node_joined_for_a_waiting_prepare(
    tmp_path: Path,
) -> None:
    """A prepare that waited for the daemon (no binding conditions) joined the node; a
    restarted plugin keeps the node in the domain while the claim stays allocated, takes it
    out when the claim goes, and records a claim as prepared when the kubelet's retry
    succeeds."""
    api = FakeApi()
    api.domain("team", "train", UID, ready=False)
    driver = _driver(api, tmp_path, ready_wait=0.05)
    await driver.prepare([_claim("d", "daemon-0", namespace="dra")])  # its pod starts
    waited = await driver.prepare([_claim("w", "channel-0")])
    assert "is not ready after" in str(waited["uid-w"])
    assert api.labels == {LABEL: UID}
    restarted = _driver(api, tmp_path, ready_wait=0.05)
    await restarted.allocated({"uid-w": frozenset({"channel-0"})})
    assert api.labels == {LABEL: UID}
    await restarted.allocated({})
    assert api.labels == {}
    api.domain("team", "train", UID, ready=True)
    [result] = (await restarted.prepare([_claim("w", "channel-0")])).values()
    assert not isinstance(result, Exception), result
    assert not _driver(api, tmp_path)._joining
    assert "uid-w" in _driver(api, tmp_path).checkpoint.claims
    assert await restarted.unprepare([ClaimRef("team", "w", "uid-w")]) == {"uid-w": None}
    assert api.labels == {}


async def test_a_join_refused_by_another_domain_records_nothing(tmp_path: Path) -> None:
    api = FakeApi()
    api.labels[LABEL] = OTHER
    api.domain("team", "train", UID, ready=True)
    driver = _driver(api, tmp_path)
    await driver.prepare_before_binding(_claim("w", "channel-0"))
    await driver.prepare([_claim("v", "channel-0")])
    assert not driver._joining
    assert not _driver(api, tmp_path)._joining


async def test_a_failed_leave_after_deallocation_is_kept_and_retried(tmp_path: Path) -> None:
    """The channel that joined the node for binding is deallocated; removing the label fails
    once (the API server answers 500). The failure is raised (the binding watcher hands the
    claims over again a second later) and the join stays recorded, so the node still
    leaves the domain: at the watcher's next call, or after a restart."""
    api = FakeApi()
    api.domain("team", "train", UID, ready=False)
    driver = _driver(api, tmp_path, binding_wait=60)
    await driver.prepare_before_binding(_claim("w", "channel-0"))
    assert api.labels == {LABEL: UID}
    api.refuse_label_removals = 1
    with pytest.raises(ApiError):
        await driver.allocated({})
    assert api.labels == {LABEL: UID}
    await driver.close()
    restarted = _driver(api, tmp_path)
    await restarted.allocated({})
    assert api.labels == {}
    assert not _driver(api, tmp_path)._joining


class _BusyNodeApi(FakeApi):
    """Something else (the kubelet, another controller's label) updates the Node between
    the driver's read and its patch, once."""

    def __init__(self) -> None:
        super().__init__()
        self.concurrent_updates = 1

    def _node(self, method: str, body: Any, content_type: str) -> Response:
        response = super()._node(method, body, content_type)
        if method == "GET" and self.concurrent_updates:
            self.concurrent_updates -= 1
            self.version += 1
        return response


async def test_a_join_is_not_failed_by_an_unrelated_update_of_the_node(tmp_path: Path) -> None:
    api = _BusyNodeApi()
    api.domain("team", "train", UID, ready=True)
    [result] = (await _driver(api, tmp_path).prepare([_claim("w", "channel-0")])).values()
    assert not isinstance(result, Exception), result
    assert api.labels == {LABEL: UID}

    api = _BusyNodeApi()
    api.domain("team", "train", UID, ready=False)
    driver = _driver(api, tmp_path / "binding", binding_wait=60)
    # Raising here makes the binding watcher set IMEXDaemonFailed: the pod is sent elsewhere.
    await driver.prepare_before_binding(_claim("v", "channel-0"))
    assert api.labels == {LABEL: UID}
    await driver.close()


async def test_a_channel_the_old_plugin_prepared_in_a_surge_update_still_leaves(
    tmp_path: Path,
) -> None:
    """A surge update runs the new plugin beside the old one on the same state directory
    and node lock. The new one read the state at its start while the old one still served
    the kubelet (a prepare waiting for the daemon, say); the kubelet then unprepares the
    claim through the new one. The node must leave the domain, and the old plugin's record
    must not be overwritten by the new one's next write."""
    api = FakeApi()
    api.domain("team", "train", UID, ready=True)
    old = _driver(api, tmp_path)
    new = _driver(api, tmp_path)  # starts beside it, reading the state
    [result] = (await old.prepare([_claim("w", "channel-0")])).values()
    assert not isinstance(result, Exception), result
    # The new plugin prepares another claim (the domain's daemon, here) ...
    [daemon] = (await new.prepare([_claim("d", "daemon-0", namespace="dra")])).values()
    assert not isinstance(daemon, Exception), daemon
    assert set(_driver(api, tmp_path).checkpoint.claims) == {"uid-w", "uid-d"}
    # ... and unprepares the old plugin's channel: the node leaves with it.
    assert await new.unprepare([ClaimRef("team", "w", "uid-w")]) == {"uid-w": None}
    assert api.labels == {}


async def _settled(driver: ImexDriver) -> None:
    tasks = [j.task for j in driver._joining.values() if j.task is not None]
    await asyncio.gather(*tasks)


async def test_a_claim_whose_spec_a_reboot_removed_is_prepared_again(tmp_path: Path) -> None:
    """The CDI specs live in /var/run/cdi (a tmpfs), the checkpoint below the kubelet's
    plugins directory (a disk): after a reboot the kubelet prepares its pods' claims again,
    and answering from the checkpoint alone would name CDI devices no spec defines (the
    containers fail to start, the node's IMEX daemon among them)."""
    api = FakeApi()
    api.domain("team", "train", UID, ready=True)
    driver = _driver(api, tmp_path)
    claims = [_claim("w", "channel-0"), _claim("d", "daemon-0", namespace="dra")]
    first = await driver.prepare(claims)
    assert not any(isinstance(r, Exception) for r in first.values()), first
    for spec in (tmp_path / "cdi").iterdir():
        spec.unlink()  # the reboot
    restarted = _driver(api, tmp_path)
    again = await restarted.prepare(claims)
    assert again == first
    specs = [json.loads(p.read_text()) for p in (tmp_path / "cdi").iterdir()]
    names = sorted(d["name"] for s in specs for d in s["devices"])
    assert names == ["uid-d-daemon-0", "uid-w-channel-0"]
    assert set(_driver(api, tmp_path).checkpoint.claims) == {"uid-w", "uid-d"}


class _FlakyStatusApi(FakeApi):
    """The API server fails the first claim status writes (away, or overloaded)."""

    def __init__(self, failures: list[str]) -> None:
        super().__init__()
        self.failures = failures

    async def request(self, method: str, path: str, **kw: Any) -> Response:
        if path.endswith("/status") and self.failures:
            if self.failures.pop(0) == "connection":
                raise aiohttp.ClientConnectionError("connection reset by peer")
            return Response(503, {}, b'{"message": "etcdserver: leader changed"}')
        return await super().request(method, path, **kw)


@pytest.mark.parametrize("failures", [["connection"], ["503"], ["503", "connection"]])
async def test_a_binding_condition_the_api_server_failed_is_set_again(
    tmp_path: Path, failures: list[str]
) -> None:
    """A condition write that failed must be tried again: otherwise the pod waits out the
    scheduler's binding timeout (10 minutes) with a ready daemon, and a connection error
    ended the follower with an exception nobody saw."""
    api = _FlakyStatusApi(list(failures))
    api.domain("team", "train", UID, ready=True)
    driver = _driver(api, tmp_path, binding_wait=60)
    await driver.prepare_before_binding(_claim("w", "channel-0"))
    await asyncio.wait_for(_settled(driver), 5)
    assert [(c, t) for c, t, _ in api.conditions] == [("w", "IMEXDaemonReady")]

    late = _FlakyStatusApi(list(failures))
    late.domain("team", "train", UID, ready=False)
    driver = _driver(late, tmp_path / "late", binding_wait=0.05)
    await driver.prepare_before_binding(_claim("w", "channel-0"))
    await asyncio.wait_for(_settled(driver), 5)
    assert [(c, t) for c, t, _ in late.conditions] == [("w", "IMEXDaemonFailed")]
    assert [r for r, _ in late.events] == ["IMEXDaemonFailed"]  # one Event, not one a try


async def test_prepare_does_not_wait_for_a_daemon_whose_claim_is_not_prepared_here(
    tmp_path: Path,
) -> None:
    """Without binding conditions (and after a reboot) the kubelet prepares the channel while
    the node's daemon pod has still to start. That pod's claim is prepared by this plugin,
    under the node lock the waiting prepare holds: waiting could only end in the timeout, and
    held the daemon's own prepare (and every other call of the node) back for 30 s."""
    api = FakeApi()
    api.domain("team", "train", UID, ready=None)  # the node's daemon has not started
    driver = _driver(api, tmp_path, ready_wait=30)
    [result] = (await asyncio.wait_for(driver.prepare([_claim("w", "channel-0")]), 5)).values()
    assert isinstance(result, Exception)
    assert "its claim is not prepared on node n0 yet" in str(result)
    assert "the kubelet tries again" in str(result)
    assert api.labels == {LABEL: UID}  # joined: that is what starts the daemon
    # The daemon's claim is prepared (its pod starts): the next prepare waits for it.
    [daemon] = (await driver.prepare([_claim("d", "daemon-0", namespace="dra")])).values()
    assert not isinstance(daemon, Exception), daemon
    api.domain("team", "train", UID, ready=True)
    [result] = (await driver.prepare([_claim("w", "channel-0")])).values()
    assert not isinstance(result, Exception), result
