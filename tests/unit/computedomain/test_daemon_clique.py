"""What the node gives its IMEX daemon, and whom the daemon peers with.

- The daemon claim's CDI spec carries the node's clique (``CLIQUE_ID``) and, on a node in a
  clique, the fabric-imex-mgmt capability device ``nvidia-imex`` opens (the NVIDIA driver's
  plugin injects the same: cmd/compute-domain-kubelet-plugin/device_state.go).
- A daemon's nodes config holds the daemons of its own clique only (the NVIDIA driver's
  writeDaemonsConfig, cmd/compute-domain-daemon/main.go); with no clique, no nvidia-imex runs
  and the readiness probe passes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog

from dra_driver.computedomain import daemon as daemon_module
from dra_driver.computedomain.api import CLIQUE_LABEL, OWN
from dra_driver.computedomain.channels import NO_CLIQUE, DaemonEdits, capability_minor
from dra_driver.computedomain.daemon import DomainPods, ImexDaemon, run_process
from dra_driver.computedomain.imexconfig import ImexConfig, ImexFiles, peer_set, run_check
from dra_driver.computedomain.nodelaunch import daemon_edits
from dra_driver.settings import Settings
from tests.unit.computedomain.test_nodedriver import UID, FakeApi, _claim, _driver

LABEL = OWN.domain_label
CLIQUES = {"n0": "c.1", "n1": "c.1", "n2": "c.2"}
IPS = {"n0": "10.0.0.1", "n1": "10.0.0.2", "n2": "10.0.1.1"}
PROC_DEVICES = "Character devices:\n195 nvidia\n508 nvidia-caps\n\nBlock devices:\n"
CAPABILITY = "DeviceFileMinor: 7\nDeviceFileMode: 438\nDeviceFileModify: 0\n"


def _pod(node: str, uid: str = UID) -> dict[str, Any]:
    return {
        "metadata": {"name": f"imex-{node}", "labels": {LABEL: uid}},
        "spec": {"nodeName": node},
        "status": {"phase": "Running", "podIP": IPS[node]},
    }


def _node(name: str, clique: str | None) -> dict[str, Any]:
    labels = {LABEL: UID} | ({CLIQUE_LABEL: clique} if clique else {})
    return {"metadata": {"name": name, "labels": labels}}


# -- the capability device -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "minor"),
    [
        (CAPABILITY, 7),
        ("DeviceFileMode: 438\nDeviceFileMinor:  4095 \n", 4095),
        ("DeviceFileMode: 438\n", None),
        ("DeviceFileMinor: x\n", None),
        ("", None),
    ],
)
def test_capability_minor(text: str, minor: int | None) -> None:
    assert capability_minor(text) == minor


def _driver_root(root: Path, capability: str | None) -> Path:
    (root / "proc").mkdir(parents=True)
    (root / "proc/devices").write_text(PROC_DEVICES)
    if capability is not None:
        caps = root / "proc/driver/nvidia/capabilities"
        caps.mkdir(parents=True)
        (caps / "fabric-imex-mgmt").write_text(capability)
    return root


def test_a_node_in_a_clique_gives_its_daemon_the_fabric_imex_mgmt_device(tmp_path: Path) -> None:
    edits = daemon_edits(_driver_root(tmp_path, CAPABILITY), "c.1")
    assert edits.clique == "c.1"
    assert edits.imex_mgmt is not None
    assert edits.imex_mgmt.to_json() == {
        "path": "/dev/nvidia-caps/nvidia-cap7",
        "type": "c",
        "major": 508,
        "minor": 7,
        "permissions": "rw",
    }


def test_an_unreadable_capability_gives_the_clique_without_a_device(tmp_path: Path) -> None:
    # The host's /proc of the test machine has no NVIDIA driver either.
    with structlog.testing.capture_logs() as logs:
        assert daemon_edits(_driver_root(tmp_path, None), "c.1") == DaemonEdits("c.1")
    assert any(
        e["log_level"] == "warning" and "fabric-imex-mgmt capability cannot be read" in e["event"]
        for e in logs
    ), logs
    assert daemon_edits(tmp_path, None) == NO_CLIQUE  # no clique: nothing to read


async def test_the_daemon_claims_spec_carries_the_clique_and_the_device(tmp_path: Path) -> None:
    api = FakeApi()
    api.domain("team", "train", UID, ready=None)
    edits = daemon_edits(_driver_root(tmp_path / "root", CAPABILITY), "c.1")
    driver = _driver(api, tmp_path, daemon=edits)
    result = (await driver.prepare([_claim("d", "daemon-0", namespace="dra")]))["uid-d"]
    assert not isinstance(result, Exception), result
    [spec_file] = (tmp_path / "cdi").iterdir()
    [device] = json.loads(spec_file.read_text())["devices"]
    edits_json = device["containerEdits"]
    assert "CLIQUE_ID=c.1" in edits_json["env"]
    assert [n["path"] for n in edits_json["deviceNodes"]] == ["/dev/nvidia-caps/nvidia-cap7"]


# -- the daemon's peers ----------------------------------------------------------------------


def test_a_daemon_peers_only_with_the_daemons_of_its_own_clique(tmp_path: Path) -> None:
    pods = [_pod(n) for n in CLIQUES]
    core = ImexDaemon(tmp_path / "nvidia-imex", ImexConfig(IPS["n0"], ImexFiles(tmp_path)))
    core.set_peers(peer_set(pods, UID, LABEL, CLIQUES, "c.1"))
    assert core.nodes().split() == [IPS["n0"], IPS["n1"]]
    assert peer_set(pods, UID, LABEL, CLIQUES, "c.2") == {IPS["n2"]}
    # A pod whose node's clique is not known yet is no peer (yet).
    assert peer_set(pods, UID, LABEL, {"n0": "c.1"}, "c.1") == {IPS["n0"]}
    # Without cliques (a claim prepared before CLIQUE_ID): every daemon, as before.
    assert peer_set(pods, UID, LABEL) == set(IPS.values())


@dataclass
class FakeApi2:
    """Pods and nodes, listed and watched by path; each watch's events, then silence."""

    lists: dict[str, list[dict[str, Any]]]
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    requests: list[tuple[str, str, str]] = field(default_factory=list)

    async def list_objects(
        self, path: str, resource: str, field_selector: str = "", *, label_selector: str = ""
    ) -> dict[str, Any]:
        self.requests.append(("list", path, label_selector))
        if resource == "nodes":
            await self.gate.wait()  # the nodes answer late
        return {"items": self.lists[resource], "metadata": {"resourceVersion": "1"}}

    async def watch_objects(
        self,
        path: str,
        resource: str,
        field_selector: str,
        resource_version: str,
        timeout_seconds: int,
        *,
        label_selector: str = "",
    ) -> AsyncIterator[dict[str, Any]]:
        for event in self.events.pop(resource, []):
            yield event
        await asyncio.Event().wait()


async def _until_len(seen: list[Any], n: int) -> None:
    for _ in range(200):
        if len(seen) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(seen)} peer sets, wanted {n}: {seen}")


async def test_the_follower_reports_the_own_cliques_daemons_once_the_nodes_are_known() -> None:
    api = FakeApi2(
        lists={
            "pods": [_pod(n) for n in CLIQUES],
            "nodes": [_node(n, c) for n, c in CLIQUES.items()],
        },
        # n2 is moved into c.1 (its plugin found another clique and relabelled it).
        events={"nodes": [{"type": "MODIFIED", "object": _node("n2", "c.1")}]},
    )
    seen: list[frozenset[str]] = []
    follower = DomainPods(
        api, namespace="dra-driver", uid=UID, names=OWN, on_peers=seen.append, clique="c.1"
    )
    task = asyncio.create_task(follower.run())
    try:
        await asyncio.sleep(0.05)
        assert seen == []  # pods listed, nodes not yet: no peer set from another clique
        api.gate.set()
        await _until_len(seen, 2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert seen == [{IPS["n0"], IPS["n1"]}, set(IPS.values())]
    selector = f"{LABEL}={UID}"
    assert ("list", "/api/v1/nodes", selector) in api.requests  # the domain's nodes only


# -- a node in no clique ------------------------------------------------------------------------


async def test_a_daemon_in_no_clique_starts_no_nvidia_imex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLIQUE_ID", "")
    monkeypatch.setenv("POD_IP", "10.0.0.1")
    monkeypatch.setenv("POD_NAMESPACE", "dra-driver")

    async def no_client(*_: Any, **__: Any) -> Any:
        raise AssertionError("no API client for a daemon in no clique")

    monkeypatch.setattr("dra_driver.kube.KubeClient.create", no_client)
    spawned: list[Any] = []
    monkeypatch.setattr(daemon_module.asyncio, "create_subprocess_exec", spawned.append)
    ns = argparse.Namespace(
        domain_uid=UID, domain="team/train", pod_ip=None, pod_namespace=None, imex_port=None,
        imex_dir=str(tmp_path / "imex"),
    )  # fmt: skip
    # The driver root has no nvidia-imex: looking for it would fail the start.
    task = asyncio.create_task(run_process(Settings(driver_root=tmp_path), ns))
    await asyncio.sleep(0.1)
    assert not task.done(), task  # waits for SIGTERM, nothing started
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert spawned == []
    assert not (tmp_path / "imex").exists()
    # Its readiness probe passes: there is no daemon to ask.
    assert run_check(tmp_path, str(tmp_path / "imex")) == 0
    monkeypatch.delenv("CLIQUE_ID")
    assert run_check(tmp_path, str(tmp_path / "imex")) == 1


def test_the_chart_lets_a_daemon_read_nodes_and_change_nothing() -> None:
    """The daemon's new watch (the domain's nodes) is allowed, read-only; it still may not
    change pods (a right to patch pods in the driver's namespace would reach the privileged
    plugin pods there)."""
    from tests.unit.test_helm_compute_domains import NAMESPACE, Attributes, Rbac, enabled

    rbac = Rbac(enabled("own"), "dra-driver-imex-daemon")
    for verb in ("get", "list", "watch"):
        assert rbac.allows(Attributes(verb, "", "nodes", "", "", "")), verb
        assert rbac.allows(Attributes(verb, "", "pods", "", NAMESPACE, "")), verb
    for verb in ("patch", "update", "create", "delete"):
        assert not rbac.allows(Attributes(verb, "", "nodes", "", "", "n0")), verb
        assert not rbac.allows(Attributes(verb, "", "pods", "", NAMESPACE, "imex-n0")), verb


# -- the node's clique label -----------------------------------------------------------------


class _FlakyNodeApi:
    """The API server fails the first patches of the Node (away, or throttling a rack of
    plugins starting at once after a power cycle)."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        self.labels: dict[str, str] = {}
        self.patches = 0

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        from dra_driver.kube import Response

        assert (method, path) == ("PATCH", "/api/v1/nodes/n0")
        self.patches += 1
        if self.failures:
            failure = self.failures.pop(0)
            if failure == "connection":
                import aiohttp

                raise aiohttp.ClientConnectionError("connection refused")
            return Response(int(failure), {}, b'{"message": "try again later"}')
        self.labels.update(kw["body"]["metadata"]["labels"])
        return Response(200, {}, b"{}")


@pytest.mark.parametrize("failures", [["503"], ["429", "connection", "500"]])
async def test_the_clique_label_is_set_even_if_the_api_server_fails_at_first(
    monkeypatch: pytest.MonkeyPatch, failures: list[str]
) -> None:
    """The domain's other daemons peer only with daemons on nodes labelled with their clique:
    a label never set leaves this node's daemon out of their nodes configs, so the domain
    never becomes ready there (was: one try, its failure only logged)."""
    from dra_driver.computedomain import nodelaunch

    monkeypatch.setattr(nodelaunch, "LABEL_RETRY_FIRST", 0.01)
    api = _FlakyNodeApi(list(failures))
    await asyncio.wait_for(nodelaunch._label_clique(api, "n0", "c.1"), 5)  # type: ignore[arg-type]
    assert api.labels == {CLIQUE_LABEL: "c.1"}
    assert api.patches == len(failures) + 1
