"""The real node's pure parts: its image writer, its configuration files, the probe parser."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests import driverroot
from tests.node import loadcheck
from tests.node.probe import parse_probe

NODE_DIR = Path(__file__).resolve().parents[2] / "testenv" / "node"


def load(name: str) -> ModuleType:
    """Import a script of testenv/node (not a package) by path."""
    spec = importlib.util.spec_from_file_location(f"node_{name}", NODE_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# The scripts import their siblings by name, as they do when run from their directory.
sys.path.insert(0, str(NODE_DIR))
ociimage = load("ociimage")
realnode = load("realnode")
host = load("host")


def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def test_oci_archive_is_a_consistent_image_layout(tmp_path: Path) -> None:
    program = tmp_path / "prog"
    program.write_bytes(b"\x7fELF not really")
    image = ociimage.Image(
        "localhost/x/y:tag",
        [
            ociimage.Entry("bin"),
            ociimage.Entry("bin/prog", source=program),
            ociimage.Entry("bin/sh", link="prog"),
        ],
        entrypoint=["/bin/prog"],
    )
    files = members(ociimage.oci_archive(image))
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    (desc,) = json.loads(files["index.json"])["manifests"]
    assert desc["annotations"]["io.containerd.image.name"] == "localhost/x/y:tag"
    manifest = json.loads(files[f"blobs/sha256/{desc['digest'][7:]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    layer = gzip.decompress(files[f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}"])
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/bin/prog"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        entries = {m.name: m for m in tar}
    assert entries["bin/prog"].isfile() and entries["bin/prog"].mode == 0o755
    assert entries["bin/sh"].issym() and entries["bin/sh"].linkname == "prog"
    # Reproducible: the same inputs give the same bytes, hence the same image digest.
    assert ociimage.oci_archive(image) == ociimage.oci_archive(image)


def test_containerd_config_points_cri_at_the_driver_cdi_dir(tmp_path: Path) -> None:
    layout = realnode.Layout(tmp_path)
    text = realnode.containerd_config(
        layout,
        snapshotter="native",
        cni_bin=Path("/cni"),
        runc=Path("/runc"),
        sandbox_image="localhost/p:1",
    )
    config = tomllib.loads(text)
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == [str(layout.cdi)]
    assert runtime["restrict_oom_score_adj"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["snapshotter"] == "native"
    assert runc["options"]["BinaryName"] == "/runc"
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "localhost/p:1"
    assert config["grpc"]["address"] == str(layout.containerd_socket)


def test_kubelet_config_gates_and_addresses(tmp_path: Path) -> None:
    config = realnode.kubelet_config(
        realnode.Layout(tmp_path),
        port=1,
        healthz_port=2,
        pki=tmp_path,
        feature_gates="DRAAdminAccess=true,SomethingOff=false",
    )
    assert config["featureGates"] == {"DRAAdminAccess": True, "SomethingOff": False}
    assert config["address"] == host.POD_GATEWAY
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["failCgroupV1"] is False
    assert config["cgroupRoot"] == f"/{host.CGROUP_PARENT}"


def test_node_zero_is_the_one_node_of_before(tmp_path: Path) -> None:
    spec = realnode.NodeSpec(tmp_path)
    assert spec.name == realnode.NODE_NAME
    assert spec.own == spec.view == realnode.Layout(tmp_path)
    assert (spec.pod_subnet, spec.pod_gateway, spec.node_ip) == (
        host.POD_SUBNET,
        host.POD_GATEWAY,
        host.POD_GATEWAY,
    )
    assert (spec.bridge, spec.cgroup_parent) == (host.BRIDGE, host.CGROUP_PARENT)
    assert spec.enter() == [] and spec.process("kubelet") == "kubelet"
    assert not spec.isolated


def test_a_second_node_has_its_own_network_directories_and_namespaces(tmp_path: Path) -> None:
    spec = realnode.NodeSpec(tmp_path, 1)
    assert spec.name == "dra-node-1" and spec.isolated
    assert spec.own.base == tmp_path / "n1"
    assert spec.view == realnode.Layout(tmp_path)
    assert spec.pod_subnet == "10.89.1.0/24" and spec.pod_gateway == "10.89.1.1"
    assert spec.node_ip == "10.89.255.11" and spec.cgroup_parent == "dra-node-1"
    assert len(spec.veth) <= 15 and len(spec.veth + "p") <= 15  # IFNAMSIZ
    assert spec.process("containerd") == "containerd-1"
    assert spec.enter() == [
        "nsenter",
        f"--net={tmp_path / 'ns' / 'net-1'}",
        f"--mount={tmp_path / 'ns' / 'mnt-1'}",
        "--",
    ]
    # What the chart mounts is node 0's paths, with the node's own directories there.
    binds = dict(spec.bind_mounts())
    assert binds[spec.own.kubelet] == spec.view.kubelet
    assert binds[spec.own.cdi] == spec.view.cdi
    assert binds[spec.own.driver_root] == spec.view.driver_root
    assert binds[spec.own.nvml_state] == spec.view.nvml_state


def test_a_second_node_configuration(tmp_path: Path) -> None:
    spec = realnode.NodeSpec(tmp_path, 1)
    text = realnode.containerd_config(
        spec.own,
        snapshotter="native",
        cni_bin=Path("/cni"),
        runc=Path("/runc"),
        sandbox_image="localhost/p:1",
        isolated=True,
    )
    config = tomllib.loads(text)
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["netns_mounts_under_state_dir"] is True
    assert config["plugins"]["io.containerd.nri.v1.nri"]["disable"] is True
    assert config["grpc"]["address"] == str(tmp_path / "n1" / "containerd" / "containerd.sock")
    cni = realnode.cni_config(
        spec.own, bridge=spec.bridge, subnet=spec.pod_subnet, gateway=spec.pod_gateway
    )
    bridge = cni["plugins"][0]
    assert bridge["bridge"] == "dranode1"
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.89.1.0/24", "gateway": "10.89.1.1"}]]
    kubelet = realnode.kubelet_config(
        spec.own,
        port=1,
        healthz_port=2,
        pki=tmp_path,
        feature_gates="",
        address=spec.node_ip,
        cgroup_parent=spec.cgroup_parent,
    )
    assert kubelet["address"] == "10.89.255.11"
    assert kubelet["cgroupRoot"] == "/dra-node-1"
    assert kubelet["containerRuntimeEndpoint"] == f"unix://{spec.own.containerd_socket}"


def test_a_second_node_kubeconfig_names_the_service_address(tmp_path: Path) -> None:
    original = tmp_path / "kubeconfig"
    original.write_text(
        json.dumps(
            {
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://127.0.0.1:6443",
                            "certificate-authority": "pki/ca.crt",
                        },
                    }
                ]
            }
        )
    )
    out = realnode.node_kubeconfig(original, tmp_path / "n1-kubeconfig")
    (cluster,) = yaml.safe_load(out.read_text())["clusters"]
    assert cluster["cluster"]["server"] == f"https://{host.API_SERVICE_IP}:443"
    assert cluster["cluster"]["certificate-authority"] == str(tmp_path / "pki" / "ca.crt")


def test_iptables_rule_sends_the_service_to_loopback() -> None:
    rule = host.iptables_rule(6443)
    assert rule[rule.index("-d") + 1] == host.API_SERVICE_IP
    assert rule[-1] == "127.0.0.1:6443"
    assert rule[rule.index("-i") + 1] == host.BRIDGE
    rule = host.iptables_rule(6443, host.NODE_BRIDGE)
    assert rule[rule.index("-i") + 1] == host.NODE_BRIDGE
    assert rule[-1] == "127.0.0.1:6443"


def test_parse_probe_reads_busybox_ls() -> None:
    log = "\n".join(
        [
            "PROBE-ENV",
            "NVIDIA_VISIBLE_DEVICES=GPU-1,GPU-2",
            "HOME=/root",
            "PROBE-DEV",
            "crw-rw-rw-    1 0        0         195,   2 Nov 24 01:23 /dev/nvidia2",
            "crw-rw-rw-    1 0        0         195, 255 Nov 24 01:23 /dev/nvidiactl",
            "ls: /dev/nvidia-caps/*: No such file or directory",
            "PROBE-MOUNTS",
            "tmpfs /tmp/nvidia-mps tmpfs rw 0 0",
            "PROBE-END",
        ]
    )
    seen = parse_probe(log)
    assert seen.visible_devices() == {"GPU-1", "GPU-2"}
    assert seen.devices == {"/dev/nvidia2": (195, 2), "/dev/nvidiactl": (195, 255)}
    assert seen.mounts == ["tmpfs /tmp/nvidia-mps tmpfs rw 0 0"]
    assert seen.mount_options("/tmp/nvidia-mps") == ["rw"]
    assert seen.mount_options("/tmp") is None


@pytest.fixture(scope="module")
def node_driver_root() -> Iterator[Path]:
    """The node's simulated driver root as node-up makes it (short path: unix sockets)."""
    if driverroot.compiler() is None:
        pytest.skip("no C compiler for the simulated driver libraries")
    base = Path(tempfile.mkdtemp(prefix="node", dir="/tmp"))
    realnode.make_driver_root(base / "driver-root", base / "nvml")
    yield base / "driver-root"
    shutil.rmtree(base, ignore_errors=True)


def test_node_up_makes_a_driver_root_of_this_architecture(node_driver_root: Path) -> None:
    libs = node_driver_root / f"usr/lib/{platform.machine()}-linux-gnu"
    assert (libs / f"libcuda.so.{driverroot.VERSION}").is_file()
    assert (libs / "libcuda.so.1").readlink() == Path(f"libcuda.so.{driverroot.VERSION}")
    version = (node_driver_root / "proc/driver/nvidia/version").read_text()
    assert driverroot.VERSION in version
    # The stand-in driver's state beside it: what a reboot restores, and the boot id.
    state = node_driver_root.parent / "nvml"
    assert (state / "nvml-data.installed").read_text() == (state / "nvml-data").read_text()
    assert (state / "boot_id").read_text().strip()
    with pytest.raises(realnode.NodeError, match="simulated driver root"):
        realnode.make_driver_root(
            libs / f"libcuda.so.{driverroot.VERSION}" / "below-a-file", state / "again"
        )


def test_loadcheck_script_and_parsers_on_the_host(node_driver_root: Path, tmp_path: Path) -> None:
    """The node test's programs, script and parsers, run here with LD_LIBRARY_PATH standing
    in for the container's mounts."""
    libs = node_driver_root / loadcheck.TRIPLET_DIR.lstrip("/")
    loadcheck.build(tmp_path / "bin", libs)
    expected = loadcheck.expected_libraries(libs)
    assert f"{loadcheck.TRIPLET_DIR}/libcuda.so" in expected
    assert "/usr/lib64/libnvidia-nvvm.so.4" in expected
    assert "/usr/lib64/libnvidia-nvvm.so" not in expected  # no development name
    text = loadcheck.script(
        [str(libs / "libcuda.so.1"), "/absent"], str(tmp_path / "bin"), wait=False
    )
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LD_LIBRARY_PATH": str(libs)}
    ran = subprocess.run(["sh", "-c", text], env=env, capture_output=True, text=True, timeout=60)
    out = loadcheck.sections(ran.stdout)
    assert set(out) == {*loadcheck.SECTIONS, "END"}
    digest = hashlib.sha256((libs / f"libcuda.so.{driverroot.VERSION}").read_bytes()).hexdigest()
    assert f"{digest}  {libs}/libcuda.so.1" in out["HASHES"]
    assert out["DLOPEN"][-1] == out["LINKED"][-1] == "exit=0", ran.stdout
    for section in ("DLOPEN", "LINKED"):
        found = loadcheck.loaded(out[section])
        assert found["libcuda.so.1"]["real"] == str(libs / f"libcuda.so.{driverroot.VERSION}")
        assert found["libcuda.so.1"]["cuInit"] == "0"
        assert found["libnvidia-ml.so.1"]["version"] == driverroot.VERSION
    search = loadcheck.search_of(out["TRACE"], "libcuda.so.1")
    assert search[0].startswith("search path=") and search[0].endswith("(LD_LIBRARY_PATH)")
    assert f"trying file={libs}/libcuda.so.1" in search
    assert loadcheck.search_of(out["TRACE"], "libnotloaded.so.1") == []
    with pytest.raises(ValueError, match="incomplete"):
        loadcheck.sections(ran.stdout.replace("CHECK-END", ""))


def test_tearing_down_needs_no_iptables_on_a_fresh_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`make test-node` tears down first; on a machine without iptables (installed only by
    node-up) there is no rule to remove, and that is not an error."""
    sys.path.insert(0, str(NODE_DIR))
    try:
        host = load("host")
    finally:
        sys.path.remove(str(NODE_DIR))
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(host, "run", lambda *a, **k: calls.append(a) or "")
    host.remove_iptables_rules()
    assert calls == []
