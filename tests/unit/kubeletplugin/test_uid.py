"""The one claim-UID check, at the kubelet's entrance (gRPC) and as a function.

The same function guards the other entrances (the GPU driver's prepare and unprepare, CDI
spec file names and checkpoint keys at start-up): see tests/unit/gpu/state/test_untrusted_uids.py.
"""

from __future__ import annotations

import uuid

import pytest

from dra_driver._proto.dra.v1 import api_pb2 as v1_pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver.kubeletplugin import ClaimRef
from dra_driver.kubeletplugin.uid import valid_uid

from .helpers import FakeDriver, FakeFetcher, make_claim, prepare_request, unprepare_request

#: What the API server makes: ``uuid.New()`` (version 4) or ``uuid.NewUUID()`` (version 1),
#: lower-case, 8-4-4-4-12.
API_SERVER_UIDS = [str(uuid.uuid4()), str(uuid.uuid1()), "00000000-0000-0000-0000-000000000000"]

#: Never a UID: path steps, hidden or option-like names, other characters, too long.
NOT_UIDS = [
    "",
    ".",
    "..",
    "...",
    ".hidden",
    "a/b",
    "a\\b",
    "a\0",
    "-",
    "-rf",
    "a b",
    "a\n",
    "a.b",
    "a_b",
    "é",
    "A-UPPER",
    str(uuid.uuid4()).upper(),
    "a" * 37,
    "a" * 300,
]


@pytest.mark.parametrize("uid", API_SERVER_UIDS)
def test_the_api_servers_uids_pass(uid: str) -> None:
    assert valid_uid(uid)


@pytest.mark.parametrize("uid", NOT_UIDS)
def test_what_can_leave_a_directory_or_is_no_uid_does_not(uid: str) -> None:
    assert not valid_uid(uid)


def test_at_most_36_characters() -> None:
    assert valid_uid("a" * 36) and not valid_uid("a" * 37)


@pytest.mark.parametrize("uid", ["-", "-rf", "---"])
async def test_grpc_refuses_what_the_driver_refuses(
    v1_stub: v1_grpc.DRAPluginStub, driver: FakeDriver, fetcher: FakeFetcher, uid: str
) -> None:
    # The gRPC check used to let these through (dashes only, or a leading dash: a file name
    # that reads as a command-line option) to the driver, whose own check disagreed.
    good = fetcher.add(make_claim(API_SERVER_UIDS[0]))
    bad = ClaimRef("default", "bad", uid)
    resp = await v1_stub.NodePrepareResources(prepare_request(v1_pb2, bad, good), timeout=10)
    assert "is not a Kubernetes UID" in resp.claims[uid].error
    assert resp.claims[API_SERVER_UIDS[0]].error == ""
    assert all(uid not in uids for _, uids in driver.calls)
    resp = await v1_stub.NodeUnprepareResources(unprepare_request(v1_pb2, bad), timeout=10)
    assert resp.claims[uid].error == ""
    assert all(uid not in uids for _, uids in driver.calls)
