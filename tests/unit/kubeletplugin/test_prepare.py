"""NodePrepareResources and NodeUnprepareResources over the v1 and v1beta1 APIs."""

from __future__ import annotations

import grpc
import pytest

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._proto.dra.v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.kubeletplugin import ClaimRef, Plugin

from .helpers import (
    DRIVER,
    NODE,
    FakeDriver,
    FakeFetcher,
    channel,
    make_claim,
    prepare_request,
    unprepare_request,
)


async def test_multi_claim_prepare_with_bad_claims(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    good = fetcher.add(make_claim("a-600d"))
    good2 = fetcher.add(
        make_claim(
            "a-600d2",
            results=[
                {"request": "a", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},
                {"request": "b", "driver": "other.dev", "pool": NODE, "device": "x"},
                {"request": "c", "driver": DRIVER, "pool": "other-node", "device": "gpu-9"},
            ],
        )
    )
    replaced = fetcher.add(make_claim("a-e0", name="replaced"))
    replaced = ClaimRef(replaced.namespace, replaced.name, "a-01d")
    unallocated = fetcher.add(make_claim("a-0a110c", allocated=False))
    failing = fetcher.add(make_claim("a-fa11"))
    driver.fail.add("a-fa11")
    missing = ClaimRef("default", "missing", "a-3155")
    api_error = fetcher.add(make_claim("a-ab1"))
    fetcher.errors[(api_error.namespace, api_error.name)] = ConnectionError("apiserver down")

    refs = [good, replaced, unallocated, failing, missing, api_error, good2]
    resp = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, *refs), timeout=10)

    assert set(resp.claims) == {r.uid for r in refs}
    ok = resp.claims["a-600d"]
    assert ok.error == ""
    assert [(list(d.request_names), d.pool_name, d.device_name) for d in ok.devices] == [
        (["gpu"], NODE, "gpu-a-600d")
    ]
    assert list(ok.devices[0].cdi_device_ids) == ["k8s.gpu.dra.dev/claim=a-600d-gpu-a-600d"]
    # Only this driver's results in this node's pool reach the driver.
    assert [d.device_name for d in resp.claims["a-600d2"].devices] == ["gpu-0"]
    assert "a-01d" in resp.claims["a-01d"].error and "replaced" in resp.claims["a-01d"].error
    assert "not allocated" in resp.claims["a-0a110c"].error
    assert resp.claims["a-fa11"].error == "boom for claim-a-fa11"
    assert "not found" in resp.claims["a-3155"].error
    assert "apiserver down" in resp.claims["a-ab1"].error
    # Bad claims never reach the driver; the good ones go in one batch.
    assert driver.calls == [("prepare", ("a-600d", "a-fa11", "a-600d2"))]


async def test_config_passed_for_this_driver_only(
    plugin: Plugin, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    seen = []
    orig = driver.prepare

    async def spy(claims):  # type: ignore[no-untyped-def]
        seen.extend(claims)
        return await orig(claims)

    driver.prepare = spy  # type: ignore[method-assign]
    ours = {
        "source": "FromClaim",
        "requests": ["gpu"],
        "opaque": {"driver": DRIVER, "parameters": {}},
    }
    theirs = {"source": "FromClass", "opaque": {"driver": "other.dev", "parameters": {}}}
    ref = fetcher.add(make_claim("a1", config=[theirs, ours]))
    async with channel(plugin.paths.dra) as ch:
        await v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            prepare_request(v1_pb2, ref), timeout=5
        )
    assert len(seen) == 1
    assert seen[0].ref == ref
    assert seen[0].config == (ours,)
    assert seen[0].claim["metadata"]["uid"] == "a1"


async def test_prepare_is_idempotent(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    ref = fetcher.add(make_claim("a1"))
    first = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=5)
    second = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=5)
    assert first == second
    assert first.claims["a1"].error == ""


async def test_duplicate_claim_in_one_request_is_prepared_once(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    ref = fetcher.add(make_claim("a1"))
    resp = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref, ref), timeout=5)
    assert list(resp.claims) == ["a1"]
    assert driver.calls == [("prepare", ("a1",))]


async def test_unprepare_without_prior_prepare(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    refs = [ClaimRef("ns", "a", "a-a"), ClaimRef("ns", "b", "a-b")]
    resp = await v1_stub.NodeUnprepareResources(unprepare_request(v1_pb2, *refs), timeout=5)
    assert {uid: c.error for uid, c in resp.claims.items()} == {"a-a": "", "a-b": ""}
    # No API call: unprepare must work while the claim is gone or the API server is down.
    assert fetcher.calls == 0


async def test_prepare_then_unprepare_twice(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    ref = fetcher.add(make_claim("a1"))
    await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=5)
    assert "a1" in driver.prepared
    for _ in range(2):
        resp = await v1_stub.NodeUnprepareResources(unprepare_request(v1_pb2, ref), timeout=5)
        assert resp.claims["a1"].error == ""
    assert driver.prepared == {}


async def test_driver_exception_fails_whole_batch_but_not_rpc(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    async def explode(claims):  # type: ignore[no-untyped-def]
        raise ValueError("driver crashed")

    driver.prepare = explode  # type: ignore[method-assign]
    driver.unprepare = explode  # type: ignore[method-assign]
    refs = [fetcher.add(make_claim("a1")), fetcher.add(make_claim("a2"))]
    resp = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, *refs), timeout=5)
    assert {uid: c.error for uid, c in resp.claims.items()} == {
        "a1": "driver crashed",
        "a2": "driver crashed",
    }
    resp2 = await v1_stub.NodeUnprepareResources(unprepare_request(v1_pb2, *refs), timeout=5)
    assert {uid: c.error for uid, c in resp2.claims.items()} == {
        "a1": "driver crashed",
        "a2": "driver crashed",
    }


async def test_claim_missing_from_driver_result_is_an_error(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher
) -> None:
    async def forgetful(claims):  # type: ignore[no-untyped-def]
        return {}

    driver.prepare = forgetful  # type: ignore[method-assign]
    ref = fetcher.add(make_claim("a1"))
    resp = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=5)
    assert "no result" in resp.claims["a1"].error


async def test_share_id_in_v1_only(plugin: Plugin, fetcher: FakeFetcher) -> None:
    ref = fetcher.add(
        make_claim(
            "a1",
            results=[
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": NODE,
                    "device": "gpu-0",
                    "shareID": "s-1",
                }
            ],
        )
    )
    async with channel(plugin.paths.dra) as ch:
        v1 = await v1_grpc.DRAPluginStub(ch).NodePrepareResources(
            prepare_request(v1_pb2, ref), timeout=5
        )
        beta = await v1beta1_grpc.DRAPluginStub(ch).NodePrepareResources(
            prepare_request(v1beta1_pb2, ref), timeout=5
        )
    assert v1.claims["a1"].devices[0].HasField("share_id")
    assert v1.claims["a1"].devices[0].share_id == "s-1"
    beta_device = beta.claims["a1"].devices[0]
    assert "share_id" not in beta_device.DESCRIPTOR.fields_by_name
    assert beta_device.device_name == "gpu-0"
    assert list(beta_device.cdi_device_ids) == list(v1.claims["a1"].devices[0].cdi_device_ids)


async def test_no_share_id_when_driver_gives_none(
    v1_stub: v1_grpc.DRAPluginStub, fetcher: FakeFetcher
) -> None:
    ref = fetcher.add(make_claim("a1"))
    resp = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, ref), timeout=5)
    assert not resp.claims["a1"].devices[0].HasField("share_id")


async def test_v1beta1_unprepare(plugin: Plugin) -> None:
    async with channel(plugin.paths.dra) as ch:
        resp = await v1beta1_grpc.DRAPluginStub(ch).NodeUnprepareResources(
            unprepare_request(v1beta1_pb2, ClaimRef("ns", "a", "a-a")), timeout=5
        )
    assert resp.claims["a-a"].error == ""


async def test_empty_requests(v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver) -> None:
    assert not (await v1_stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest())).claims
    assert not (await v1_stub.NodeUnprepareResources(v1_pb2.NodeUnprepareResourcesRequest())).claims
    assert driver.calls == []


@pytest.mark.parametrize("method", ["NodePrepareResources", "NodeUnprepareResources"])
async def test_full_method_paths(plugin: Plugin, method: str) -> None:
    """The kubelet dials these exact paths; the generated stubs must match them."""
    async with channel(plugin.paths.dra) as ch:
        for pkg, pb2 in (
            ("k8s.io.kubelet.pkg.apis.dra.v1", v1_pb2),
            ("k8s.io.kubelet.pkg.apis.dra.v1beta1", v1beta1_pb2),
        ):
            req_type = getattr(pb2, f"{method}Request")
            resp_type = getattr(pb2, f"{method}Response")
            call = ch.unary_unary(
                f"/{pkg}.DRAPlugin/{method}",
                request_serializer=req_type.SerializeToString,
                response_deserializer=resp_type.FromString,
            )
            resp = await call(req_type(), timeout=5)
            assert isinstance(resp, resp_type)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary(f"/k8s.io.kubelet.pkg.apis.dra.v1alpha4.DRAPlugin/{method}")(
                b"", timeout=5
            )
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize("uid", ["a" * 300, "../../etc", "A-UPPER", "a" * 37, ""])
async def test_invalid_claim_uid_is_refused_per_claim_and_unprepares_idempotently(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher, uid: str
) -> None:
    good = fetcher.add(make_claim("a-600d"))
    bad = ClaimRef("default", "bad", uid)
    resp = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, bad, good), timeout=10)
    assert "is not a Kubernetes UID" in resp.claims[uid].error
    assert len(resp.claims[uid].error) < 200
    assert resp.claims["a-600d"].error == ""
    # The driver never sees the bad UID (it would name files after it).
    assert all(uid not in uids for _, uids in driver.calls)
    for _ in range(2):
        resp = await v1_stub.NodeUnprepareResources(unprepare_request(v1_pb2, bad), timeout=10)
        assert resp.claims[uid].error == ""


@pytest.mark.parametrize(("namespace", "name"), [("", "claim"), ("default", ""), ("default", "..")])
async def test_claim_without_a_valid_namespace_and_name_is_refused_without_an_api_read(
    v1_stub: v1_grpc.DRAPluginStub,
    driver: FakeDriver,
    fetcher: FakeFetcher,
    namespace: str,
    name: str,
) -> None:
    # An empty name would read the whole collection of claims (".." the namespace object).
    good = fetcher.add(make_claim("a-600d"))
    bad = ClaimRef(namespace, name, "a-bad")
    resp = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, bad, good), timeout=10)
    assert "not a ResourceClaim namespace and name" in resp.claims["a-bad"].error
    assert "a-bad" in resp.claims["a-bad"].error
    assert resp.claims["a-600d"].error == ""
    assert fetcher.calls == 1
    assert all("a-bad" not in uids for _, uids in driver.calls)
