"""The Python floor: the least a Python kubelet plugin does for the node benchmark's claims.

Same protos and the same claim read as the agent (``dra_driver.kube.KubeClient``, one GET per
claim), the same syncs as for a plain claim (the journal fdatasync'd when a prepare completes
and when an unprepare completes; the CDI spec written without fsync, atomically), and nothing
else: no validation beyond the claim's UID, no config, no sharing, no MIG, no health, no
status report, no logs, no metrics, one ResourceSlice published once. What the agent spends
beyond this is the price of what it does; what this spends is the price of Python here.

Run by ``bench/bench_node.py`` (contender ``floor``), not shipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from dra_driver._proto.dra.v1 import api_pb2 as pb2
from dra_driver._proto.dra.v1 import api_pb2_grpc as pb2_grpc
from dra_driver._proto.pluginregistration import api_pb2 as reg_pb2
from dra_driver._proto.pluginregistration import api_pb2_grpc as reg_grpc

if TYPE_CHECKING:
    from dra_driver.kube import KubeClient

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}"


class Floor:
    """NodePrepareResources and NodeUnprepareResources, the least that can be done."""

    #: Set once the sockets are bound; the benchmark prepares only after the slice is published.
    client: KubeClient

    def __init__(self, driver: str, cdi_root: Path, state: Path) -> None:
        self.driver = driver
        self.cdi_root = cdi_root
        self.journal = os.open(state / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _log(self, entry: dict[str, Any]) -> None:
        os.write(self.journal, json.dumps(entry).encode() + b"\n")
        os.fdatasync(self.journal)

    def _spec(self, uid: str) -> Path:
        return self.cdi_root / f"floor-{uid}.json"

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            out = response.claims[claim.uid]
            got = await self.client.request("GET", CLAIMS.format(claim.namespace, claim.name))
            body = got.json() if got.status == 200 else {}
            if body.get("metadata", {}).get("uid") != claim.uid:
                out.error = f"claim {claim.namespace}/{claim.name}: HTTP {got.status} or replaced"
                continue
            results = [
                r
                for r in body["status"]["allocation"]["devices"]["results"]
                if r["driver"] == self.driver
            ]
            spec = {
                "cdiVersion": "0.6.0",
                "kind": "k8s.floor.example.com/claim",
                "devices": [
                    {"name": f"{claim.uid}-{r['device']}", "containerEdits": {"env": ["X=1"]}}
                    for r in results
                ],
            }
            tmp = self._spec(claim.uid).with_suffix(".tmp")
            tmp.write_text(json.dumps(spec))
            tmp.rename(self._spec(claim.uid))
            self._log({"uid": claim.uid, "state": "completed"})
            for r in results:
                out.devices.add(
                    request_names=[r["request"]],
                    pool_name=r["pool"],
                    device_name=r["device"],
                    cdi_device_ids=[f"k8s.floor.example.com/claim={claim.uid}-{r['device']}"],
                )
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            self._spec(claim.uid).unlink(missing_ok=True)
            self._log({"uid": claim.uid, "state": "gone"})
            response.claims[claim.uid].error = ""
        return response


class Registration:
    def __init__(self, driver: str, endpoint: str) -> None:
        self.info = reg_pb2.PluginInfo(
            type="DRAPlugin", name=driver, endpoint=endpoint, supported_versions=["v1.DRAPlugin"]
        )

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return self.info

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        return reg_pb2.RegistrationStatusResponse()


async def serve(args: argparse.Namespace) -> None:
    state = args.plugins_dir / args.driver_name
    state.mkdir(parents=True, exist_ok=True)
    args.registry_dir.mkdir(parents=True, exist_ok=True)
    args.cdi_root.mkdir(parents=True, exist_ok=True)
    dra_socket = state / "dra.sock"
    reg_socket = args.registry_dir / f"{args.driver_name}-reg.sock"
    for path in (dra_socket, reg_socket):
        path.unlink(missing_ok=True)
    floor = Floor(args.driver_name, args.cdi_root, state)
    dra = grpc.aio.server()
    pb2_grpc.add_DRAPluginServicer_to_server(floor, dra)  # type: ignore[no-untyped-call]
    dra.add_insecure_port(f"unix:{dra_socket}")
    await dra.start()
    reg = grpc.aio.server()
    registration = Registration(args.driver_name, str(dra_socket))
    reg_grpc.add_RegistrationServicer_to_server(registration, reg)  # type: ignore[no-untyped-call]
    reg.add_insecure_port(f"unix:{reg_socket}")
    await reg.start()
    # Bound first, the HTTP client loaded after, as the agent does.
    from dra_driver.kube import KubeClient

    floor.client = client = await KubeClient.create(args.kubeconfig)
    await client.request(
        "POST",
        "/apis/resource.k8s.io/v1/resourceslices",
        body={
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"generateName": f"{args.node_name}-floor-"},
            "spec": {
                "driver": args.driver_name,
                "nodeName": args.node_name,
                "pool": {"name": args.node_name, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": f"gpu-{i}"} for i in range(args.num_devices)],
            },
        },
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await reg.stop(0)
    await dra.stop(1)
    await client.close()
    for path in (dra_socket, reg_socket):
        path.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="The least a Python DRA kubelet plugin does.")
    parser.add_argument("--driver-name", required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--registry-dir", type=Path, required=True)
    parser.add_argument("--plugins-dir", type=Path, required=True)
    parser.add_argument("--cdi-root", type=Path, required=True)
    parser.add_argument("--num-devices", type=int, required=True)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
