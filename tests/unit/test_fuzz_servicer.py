"""Fuzzing the kubelet-facing servers: generated claims through the real servicers and driver,
and raw garbage on both unix sockets.

The servers run in a background event loop (as in the agent), with the real GPU driver over a
``DeviceState`` on the simulated ``mixed`` profile in a temp dir, and a fake claim fetcher that
serves whatever the strategies produce. Hypothesis drives them with a plain synchronous gRPC
client, so every example is a real call over a real socket.

Properties: the RPC itself never fails; every claim gets exactly one outcome (an error or
devices); a well-formed claim in a batch is prepared whatever the other claims of the batch
contain; prepared state matches what was answered, and unprepare undoes it. Garbage bytes and
truncated HTTP/2 frames never stop the servers answering a proper call.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import struct
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver._proto.pluginregistration import api_pb2 as reg_pb2
from dra_driver._proto.pluginregistration import api_pb2_grpc as reg_grpc
from dra_driver.gpu.discovery.simulated import SimulatedDiscovery
from dra_driver.gpu.driver import GpuDriver
from dra_driver.gpu.publish.catalog import build_catalog
from dra_driver.gpu.state.device_state import DeviceState
from dra_driver.kubeletplugin import ClaimRef, Plugin
from tests.unit.kubeletplugin.helpers import DRIVER, NODE, FakeFetcher, config_for

PROFILE = "mixed"
INVENTORY = SimulatedDiscovery(PROFILE, NODE).discover()
DEVICES: dict[str, str] = {
    str(d["name"]): str(d["attributes"]["type"]["string"]) for d in build_catalog(INVENTORY).published()
}
API_VERSION = "gpu.dra.dev/v1alpha1"


@dataclass
class Served:
    """The servers under test and the objects behind them."""

    plugin: Plugin
    fetcher: FakeFetcher
    state: DeviceState
    loop: asyncio.AbstractEventLoop

    def dra_channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"unix:{self.plugin.paths.dra}")

    def reg_channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"unix:{self.plugin.paths.registration}")


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """The plugin's servers with the real GPU driver, on an event loop in a thread."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="fz"))
    state = DeviceState(
        inventory=INVENTORY,
        driver_name=DRIVER,
        node_name=NODE,
        cdi_root=base / "cdi",
        state_dir=base / "plugins" / DRIVER,
        boot_id="boot-fuzz",
    )
    fetcher = FakeFetcher()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzz-servers", daemon=True)
    thread.start()

    async def start() -> Plugin:
        plugin = Plugin(config_for(base), GpuDriver(state), fetcher)
        await plugin.start()
        return plugin

    plugin = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield Served(plugin, fetcher, state, loop)
    finally:
        asyncio.run_coroutine_threadsafe(plugin.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------------------------

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
# Arbitrary JSON, as a claim's fields may hold after an API server of another version, a
# webhook or a hand-written status got at it.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | names,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)
requests = st.sampled_from(["gpu", "a", "b", "gpu/sub"])
memory = st.sampled_from(["1Gi", "512Mi", "10G", "0", "lots", "1.5Gi", ""])


@st.composite
def valid_parameters(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    """A parameters object the driver accepts for ``kind``."""
    params: dict[str, Any] = {"apiVersion": API_VERSION, "kind": kind}
    strategy = draw(st.sampled_from([None, "TimeSlicing", "MPS"]))
    if strategy is None:
        return params
    sharing: dict[str, Any] = {"strategy": strategy}
    if strategy == "TimeSlicing" and kind == "GpuConfig" and draw(st.booleans()):
        interval = draw(st.sampled_from(["Default", "Short", "Medium", "Long"]))
        sharing["timeSlicingConfig"] = {"interval": interval}
    if strategy == "MPS" and draw(st.booleans()):
        mps: dict[str, Any] = {"defaultActiveThreadPercentage": draw(st.integers(1, 100))}
        if draw(st.booleans()):
            mps["defaultPinnedDeviceMemoryLimit"] = draw(st.sampled_from(["1Gi", "512Mi"]))
        sharing["mpsConfig"] = mps
    params["sharing"] = sharing
    return params


@st.composite
def mutated_parameters(draw: st.DrawFn) -> Any:
    """Parameters that are almost right, or not right at all."""
    base = draw(valid_parameters(draw(st.sampled_from(["GpuConfig", "MigDeviceConfig"]))))
    how = draw(st.integers(0, 6))
    if how == 0:
        return draw(json_values)
    if how == 1:
        base["apiVersion"] = draw(st.sampled_from(["gpu.dra.dev/v1", "v1", "", None]))
    elif how == 2:
        base["kind"] = draw(st.sampled_from(["Gpu", "", None, 7, "MigDeviceConfig"]))
    elif how == 3:
        base[draw(names)] = draw(json_values)
    elif how == 4:
        base["sharing"] = draw(json_values)
    elif how == 5:
        base["sharing"] = {
            "strategy": draw(st.sampled_from(["MPS", "TimeSlicing", "Nope"])),
            "mpsConfig": {
                "defaultActiveThreadPercentage": draw(st.integers(-5, 200) | json_values),
                "defaultPinnedDeviceMemoryLimit": draw(memory),
                "defaultPerDevicePinnedMemoryLimit": draw(
                    st.dictionaries(names, memory, max_size=2) | json_values
                ),
            },
        }
    else:
        base["sharing"] = {"strategy": "TimeSlicing", "timeSlicingConfig": draw(json_values)}
    return base


def config_entry(parameters: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An allocation config entry of this driver."""
    return st.fixed_dictionaries(
        {"opaque": st.fixed_dictionaries({"driver": st.just(DRIVER), "parameters": parameters})},
        optional={
            "requests": st.lists(requests, max_size=2),
            "source": st.sampled_from(["FromClass", "FromClaim"]),
        },
    )


garbage_config = st.one_of(
    config_entry(mutated_parameters()),
    json_values,
    st.fixed_dictionaries(
        {"opaque": st.fixed_dictionaries({"driver": names, "parameters": json_values})}
    ),
    st.fixed_dictionaries({"opaque": json_values, "requests": json_values}),
)


@st.composite
def valid_claim_parts(
    draw: st.DrawFn, free: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Results on devices taken from ``free`` (removed from it) and configs that fit them."""
    count = draw(st.integers(1, min(2, len(free))))
    results: list[dict[str, Any]] = []
    configs: list[dict[str, Any]] = []
    for i in range(count):
        device = free.pop(draw(st.integers(0, len(free) - 1)))
        request = f"r{i}"
        result: dict[str, Any] = {
            "request": request,
            "driver": DRIVER,
            "pool": NODE,
            "device": device,
        }
        if draw(st.booleans()):
            result["shareID"] = draw(st.uuids()).hex
        results.append(result)
        if draw(st.booleans()):
            kind = "MigDeviceConfig" if DEVICES[device] == "mig" else "GpuConfig"
            configs.append(
                {
                    "source": draw(st.sampled_from(["FromClass", "FromClaim"])),
                    "requests": [request],
                    "opaque": {"driver": DRIVER, "parameters": draw(valid_parameters(kind))},
                }
            )
    # Results and configs of other drivers are somebody else's business.
    if draw(st.booleans()):
        results.append({"request": "x", "driver": "other.dev", "pool": NODE, "device": "d0"})
        configs.append({"opaque": {"driver": "other.dev", "parameters": draw(json_values)}})
    return results, configs


# Mostly results this driver would act on (the interesting case), each with some field wrong.
garbage_result = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            "request": requests | json_values,
            "driver": st.just(DRIVER),
            "pool": st.just(NODE),
            "device": st.sampled_from(sorted(DEVICES)) | names | json_values,
        },
        optional={
            "adminAccess": st.booleans() | json_values,
            "shareID": names | json_values,
        },
    ),
    st.fixed_dictionaries({"driver": st.just(DRIVER) | names, "pool": st.just(NODE) | names}),
)


@st.composite
def garbage_claim(draw: st.DrawFn, uid: str) -> dict[str, Any] | None:
    """A claim object that is wrong in some way (or, by chance, right)."""
    how = draw(st.integers(0, 8))
    meta: Any = {"name": f"claim-{uid}", "namespace": "ns", "uid": uid}
    if how == 0:
        return None  # not found
    if how == 1:
        return draw(st.dictionaries(names, json_values, max_size=4))
    if how == 2:
        meta = dict(meta, uid=draw(names | json_values))  # replaced, or nonsense
    status: Any = {
        "allocation": {
            "devices": {
                "results": draw(st.lists(garbage_result, max_size=3)),
                "config": draw(st.lists(garbage_config, max_size=3)),
            }
        }
    }
    if how == 3:
        status = draw(json_values)
    elif how == 4:
        status = {"allocation": draw(json_values)}
    return {"metadata": meta, "spec": draw(json_values), "status": status}


@dataclass
class Case:
    """One batch: the claims the kubelet names, what the API server holds, which are valid."""

    refs: list[ClaimRef]
    objects: dict[str, dict[str, Any] | None]
    valid: set[str]


@st.composite
def batches(draw: st.DrawFn) -> Case:
    free = sorted(DEVICES)
    refs: list[ClaimRef] = []
    objects: dict[str, dict[str, Any] | None] = {}
    valid: set[str] = set()
    for i in range(draw(st.integers(1, 5))):
        uid = f"0000-{i}"
        ref = ClaimRef("ns", f"claim-{uid}", uid)
        refs.append(ref)
        if free and draw(st.booleans()):
            results, configs = draw(valid_claim_parts(free))
            objects[uid] = {
                "metadata": {"name": ref.name, "namespace": "ns", "uid": uid},
                "spec": {"devices": {"requests": [{"name": r["request"]} for r in results]}},
                "status": {"allocation": {"devices": {"results": results, "config": configs}}},
            }
            valid.add(uid)
        else:
            objects[uid] = draw(garbage_claim(uid))
    if draw(st.booleans()):
        refs.append(refs[0])  # the kubelet may repeat itself
    return Case(refs, objects, valid)


# --------------------------------------------------------------------------------------------
# properties
# --------------------------------------------------------------------------------------------


def _load(served: Served, case: Case) -> None:
    served.fetcher.claims.clear()
    for ref in case.refs:
        obj = case.objects[ref.uid]
        if obj is not None:
            served.fetcher.claims[(ref.namespace, ref.name)] = obj


def _claims(pb2: Any, refs: list[ClaimRef]) -> list[Any]:
    return [pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]


def _devices_of(obj: dict[str, Any] | None) -> set[str]:
    """The devices of this driver and node a valid claim object allocates."""
    assert obj is not None
    results = obj["status"]["allocation"]["devices"]["results"]
    return {r["device"] for r in results if r.get("driver") == DRIVER and r.get("pool") == NODE}


def _check_batch(served: Served, case: Case, pb2: Any, stub: Any) -> None:
    # Start clean even after a failed example, so one failure does not hide behind others.
    served.state.unprepare(
        [ClaimRef(r.namespace, r.name, uid) for uid, r in served.state.prepared_claims().items()]
    )
    _load(served, case)
    uids = {r.uid for r in case.refs}
    request = pb2.NodePrepareResourcesRequest(claims=_claims(pb2, case.refs))
    response = stub.NodePrepareResources(request, timeout=30)  # an RpcError fails the test
    assert set(response.claims) == uids
    prepared = served.state.prepared_claims()
    held: dict[str, str] = {}
    for uid, result in response.claims.items():
        if result.error:
            assert not result.devices, (uid, result)
            assert uid not in prepared, uid
            if uid in case.valid:
                # The one excuse: a claim earlier in the batch holds one of its devices.
                taken = {d.device_name for u, c in prepared.items() for d in c.devices if u != uid}
                assert "is already prepared for claim" in result.error, result.error
                assert _devices_of(case.objects[uid]) & taken, result.error
            continue
        assert result.devices, uid
        ours = _devices_of(case.objects[uid])
        assert {d.device_name for d in result.devices} == ours
        assert uid in prepared and {d.device_name for d in prepared[uid].devices} == ours
        for device in prepared[uid].devices:
            if device.sharing != "admin":
                assert held.setdefault(device.device_name, uid) == uid, device.device_name
        assert served.state.spec_path(uid).exists()
    # A repeated prepare answers the same.
    again = stub.NodePrepareResources(request, timeout=30)
    for uid, result in response.claims.items():
        if not result.error:
            assert again.claims[uid] == result
    unprepare = pb2.NodeUnprepareResourcesRequest(claims=_claims(pb2, case.refs))
    undone = stub.NodeUnprepareResources(unprepare, timeout=30)
    assert set(undone.claims) == uids
    assert all(r.error == "" for r in undone.claims.values()), undone
    assert served.state.prepared_count() == 0
    assert not any(served.state.cdi_root.glob("*.json"))


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=batches(), v1=st.booleans())
def test_prepare_never_fails_the_rpc(served: Served, case: Case, v1: bool) -> None:
    pb2, grpc_mod = (v1_pb2, v1_grpc) if v1 else (v1beta1_pb2, v1beta1_grpc)
    with served.dra_channel() as ch:
        _check_batch(served, case, pb2, grpc_mod.DRAPluginStub(ch))


def _claim_object(uid: str, results: list[Any], config: list[Any] | None = None) -> dict[str, Any]:
    allocation = {"devices": {"results": results, "config": config or []}}
    return {
        "metadata": {"name": f"claim-{uid}", "namespace": "ns", "uid": uid},
        "status": {"allocation": allocation},
    }


GOOD_RESULT = {"request": "r", "driver": DRIVER, "pool": NODE, "device": "gpu-2"}
BAD_RESULT = {"request": "r", "driver": DRIVER, "pool": NODE, "device": "gpu-3"}


@pytest.mark.parametrize(
    ("results", "config"),
    [
        ([{**BAD_RESULT, "shareID": 5}], None),
        ([{**BAD_RESULT, "request": {"a": 1}}], None),
        ([BAD_RESULT], [{"opaque": {"driver": DRIVER, "parameters": {}}, "requests": 5}]),
        ([BAD_RESULT], [[1]]),
        ([BAD_RESULT], [{"opaque": [DRIVER]}]),
        ([BAD_RESULT], [{"opaque": {"driver": DRIVER, "parameters": []}}]),
    ],
    ids=["share-id-int", "request-dict", "requests-int", "config-list", "opaque-list", "params"],
)
def test_malformed_claim_fails_alone(served: Served, results: list[Any], config: Any) -> None:
    """Found by the fuzzer: a malformed claim used to fail its whole batch (and leave the
    good claims half recorded)."""
    objects: dict[str, dict[str, Any] | None] = {
        "bad0": _claim_object("bad0", results, config),
        "600d": _claim_object("600d", [GOOD_RESULT]),
    }
    refs = [ClaimRef("ns", "claim-bad", "bad0"), ClaimRef("ns", "claim-good", "600d")]
    with served.dra_channel() as ch:
        _check_batch(served, Case(refs, objects, {"600d"}), v1_pb2, v1_grpc.DRAPluginStub(ch))


@settings(max_examples=60, deadline=None)
@given(
    refs=st.lists(
        st.builds(ClaimRef, names, names, names),
        max_size=4,
    )
)
@example(refs=[ClaimRef("", "", "\x00"), ClaimRef("ns", "x", "../.."), ClaimRef("ns", "y", "/")])
def test_unprepare_of_anything_succeeds(served: Served, refs: list[ClaimRef]) -> None:
    """Unknown claims, odd names and UIDs: unprepare is idempotent and never fails."""
    with served.dra_channel() as ch:
        stub = v1_grpc.DRAPluginStub(ch)
        request = v1_pb2.NodeUnprepareResourcesRequest(claims=_claims(v1_pb2, refs))
        response = stub.NodeUnprepareResources(request, timeout=30)
    assert set(response.claims) == {r.uid for r in refs}
    # A UID that is a path ("../x") must not make the driver touch files outside its dirs.
    assert all(r.error == "" for r in response.claims.values())


# --------------------------------------------------------------------------------------------
# raw bytes on the sockets
# --------------------------------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind: int, flags: int, stream: int, payload: bytes, length: int | None = None) -> bytes:
    """An HTTP/2 frame; ``length`` may lie about the payload size."""
    size = len(payload) if length is None else length
    return struct.pack(">I", size)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _send(path: Path, data: bytes) -> None:
    """Write ``data`` and hang up, reading whatever comes back for a moment."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        sock.connect(str(path))
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
        except OSError:
            pass  # a reset or a timeout is the server's right


def _still_answers(served: Served) -> None:
    with served.reg_channel() as ch:
        info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=10)
    assert info.name == DRIVER
    with served.dra_channel() as ch:
        ref = ClaimRef("ns", "probe", "9a0be")
        request = v1_pb2.NodePrepareResourcesRequest(claims=_claims(v1_pb2, [ref]))
        response = v1_grpc.DRAPluginStub(ch).NodePrepareResources(request, timeout=10)
    assert "not found" in response.claims["9a0be"].error


HEADERS, SETTINGS, DATA, WINDOW_UPDATE, CONTINUATION = 1, 4, 0, 8, 9

CRAFTED = [
    b"",
    b"\x00",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    PREFACE[:10],
    PREFACE,
    PREFACE + frame(SETTINGS, 0, 0, b"\x00\x03")[:7],  # truncated header
    PREFACE + frame(SETTINGS, 0, 0, b"", length=600),  # promises a payload it never sends
    PREFACE + frame(SETTINGS, 0, 0, b"") + frame(HEADERS, 4, 1, b"\xff\xff\xff\xff"),  # bad HPACK
    PREFACE + frame(SETTINGS, 0, 0, b"") + frame(HEADERS, 0, 1, b"\x82\x86"),  # no END_HEADERS
    PREFACE + frame(SETTINGS, 0, 0, b"") + frame(CONTINUATION, 4, 3, b"\x84"),  # orphan
    PREFACE + frame(SETTINGS, 0, 0, b"") + frame(DATA, 1, 1, b"\x00" * 5),  # data on idle stream
    PREFACE + frame(SETTINGS, 0, 0, b"") + frame(WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff") * 3,
    PREFACE + frame(SETTINGS, 0, 0, b"") + frame(HEADERS, 4, 1, b"\x82\x86\x84", length=2**24 - 1),
]


@pytest.mark.parametrize("data", CRAFTED, ids=range(len(CRAFTED)))
def test_crafted_frames_do_not_stop_the_servers(served: Served, data: bytes) -> None:
    for path in (served.plugin.paths.dra, served.plugin.paths.registration):
        _send(path, data)
    _still_answers(served)


@settings(max_examples=40, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=512),
        st.binary(max_size=512).map(lambda b: PREFACE + b),
        st.lists(
            st.tuples(
                st.integers(0, 12), st.integers(0, 255), st.integers(0, 7), st.binary(max_size=64)
            ),
            max_size=6,
        ).map(lambda fs: PREFACE + b"".join(frame(k, f, s, p) for k, f, s, p in fs)),
    ),
    cut=st.integers(0, 600),
)
def test_garbage_and_truncated_frames_do_not_stop_the_servers(
    served: Served, data: bytes, cut: int
) -> None:
    for path in (served.plugin.paths.dra, served.plugin.paths.registration):
        _send(path, data[: cut or None])
    _still_answers(served)
