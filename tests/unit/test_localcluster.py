"""Pure parts of the local control-plane launcher (no binaries, no network)."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from devenv import localcluster as lc
from devenv.localcluster import cluster as lc_cluster
from devenv.localcluster import releases
from devenv.localcluster.cluster import stop_rank
from devenv.localcluster.features import gate_off_reason
from devenv.localcluster.processes import pid_alive

ROOT = Path(__file__).resolve().parents[2]


def test_pick_free_ports_distinct_and_bindable() -> None:
    ports = lc.pick_free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert lc.pick_free_ports(0) == []
    with pytest.raises(ValueError):
        lc.pick_free_ports(-1)


def test_ports_pick() -> None:
    p = lc.Ports.pick()
    values = [p.etcd_client, p.etcd_peer, p.apiserver, p.scheduler, p.controller_manager]
    assert len(set(values)) == 5
    assert all(1024 <= v < 65536 for v in values)


def test_token_auth_line() -> None:
    line = lc.token_auth_line("abc", "admin", "uid-1", ["system:masters", "devs"])
    assert line == 'abc,admin,uid-1,"system:masters,devs"'
    assert lc.token_auth_line("abc", "admin", "uid-1", []) == "abc,admin,uid-1"
    for bad in ("a,b", 'a"b', "", "a\nb"):
        with pytest.raises(ValueError):
            lc.token_auth_line(bad, "admin", "uid", ["g"])


def test_render_kubeconfig_with_ca() -> None:
    text = lc.render_kubeconfig("https://127.0.0.1:6443", "tok", ca_data=b"PEM")
    cfg = yaml.safe_load(text)
    assert cfg["kind"] == "Config"
    assert cfg["current-context"] == "testenv"
    cluster = cfg["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"PEM"
    assert "insecure-skip-tls-verify" not in cluster
    assert cfg["users"][0]["user"] == {"token": "tok"}
    ctx = cfg["contexts"][0]
    assert ctx == {"name": "testenv", "context": {"cluster": "testenv", "user": "admin"}}


def test_render_kubeconfig_insecure() -> None:
    cfg = yaml.safe_load(lc.render_kubeconfig("https://x:1", "t", cluster="c", user="u"))
    assert cfg["clusters"][0] == {
        "name": "c",
        "cluster": {"server": "https://x:1", "insecure-skip-tls-verify": True},
    }
    assert cfg["contexts"][0]["context"] == {"cluster": "c", "user": "u"}


def _flag_map(flags: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in flags:
        key, _, value = f.partition("=")
        out[key] = value
    return out


def test_apiserver_flags(tmp_path: Path) -> None:
    flags = lc.apiserver_flags(
        port=6443,
        etcd_port=2379,
        pki_dir=tmp_path / "pki",
        cert_dir=tmp_path / "certs",
        token_file=tmp_path / "tokens.csv",
        feature_gates="A=true,B=true",
        runtime_config="resource.k8s.io/v1beta1=true",
        extra=["--v=5"],
    )
    m = _flag_map(flags)
    assert m["--bind-address"] == "127.0.0.1"
    assert m["--secure-port"] == "6443"
    assert m["--etcd-servers"] == "http://127.0.0.1:2379"
    assert m["--authorization-mode"] == "Node,RBAC"
    assert m["--token-auth-file"] == str(tmp_path / "tokens.csv")
    assert m["--service-account-key-file"] == str(tmp_path / "pki" / "sa.pub")
    assert m["--service-account-signing-key-file"] == str(tmp_path / "pki" / "sa.key")
    assert m["--service-account-issuer"].startswith("https://")
    assert m["--feature-gates"] == "A=true,B=true"
    assert m["--runtime-config"] == "resource.k8s.io/v1beta1=true"
    assert flags[-1] == "--v=5"  # extra args come last and win
    # nothing listens beyond loopback
    assert not any(f.endswith(("=0.0.0.0", "=::")) for f in flags)


def test_apiserver_flags_omit_empty_gates(tmp_path: Path) -> None:
    flags = lc.apiserver_flags(
        port=1,
        etcd_port=2,
        pki_dir=tmp_path,
        cert_dir=tmp_path,
        token_file=tmp_path / "t",
        feature_gates="",
        runtime_config="",
    )
    assert not any(f.startswith(("--feature-gates", "--runtime-config")) for f in flags)


def test_scheduler_and_controller_manager_flags(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    sched = _flag_map(
        lc.scheduler_flags(
            port=10259, kubeconfig=kubeconfig, cert_dir=tmp_path / "s", feature_gates="X=true"
        )
    )
    assert sched["--kubeconfig"] == str(kubeconfig)
    assert sched["--authentication-kubeconfig"] == str(kubeconfig)
    assert sched["--bind-address"] == "127.0.0.1"
    assert sched["--secure-port"] == "10259"
    assert sched["--leader-elect"] == "false"
    assert sched["--feature-gates"] == "X=true"

    cm = _flag_map(
        lc.controller_manager_flags(
            port=10257,
            kubeconfig=kubeconfig,
            cert_dir=tmp_path / "c",
            pki_dir=tmp_path / "pki",
            feature_gates="X=true",
        )
    )
    assert cm["--use-service-account-credentials"] == "false"
    controllers = cm["--controllers"].split(",")
    for needed in (
        "resourceclaim-controller",
        "garbage-collector-controller",
        "namespace-controller",
        "serviceaccount-controller",
        "device-taint-eviction-controller",
    ):
        assert needed in controllers
    assert cm["--service-account-private-key-file"] == str(tmp_path / "pki" / "sa.key")


def test_kubelet_flags(tmp_path: Path) -> None:
    flags = lc.kubelet_flags(
        kubeconfig=tmp_path / "kc",
        node_name="n1",
        root_dir=tmp_path / "n1",
        labels={"b": "2", "a": "1"},
        cdi_dirs=[tmp_path / "etc-cdi", tmp_path / "run-cdi"],
        feature_gates="G=true",
    )
    assert "--node-name=n1" in flags
    assert [f for f in flags if f.startswith("--node-label=")] == [
        "--node-label=a=1",
        "--node-label=b=2",
    ]
    assert [f for f in flags if f.startswith("--cdi-dir=")] == [
        f"--cdi-dir={tmp_path / 'etc-cdi'}",
        f"--cdi-dir={tmp_path / 'run-cdi'}",
    ]
    assert "--feature-gates=G=true" in flags


def test_etcd_flags(tmp_path: Path) -> None:
    flags = lc.etcd_flags(tmp_path / "etcd", 2379, 2380)
    assert flags[:2] == ["--data-dir", str(tmp_path / "etcd")]
    assert "http://127.0.0.1:2379" in flags
    assert "http://127.0.0.1:2380" in flags


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("n1", ("n1", {})),
        ("n1:", ("n1", {})),
        ("n1:a=1,b=x/y", ("n1", {"a": "1", "b": "x/y"})),
        ("n1:gpu.dra.dev/present=", ("n1", {"gpu.dra.dev/present": ""})),
    ],
)
def test_parse_node_spec(spec: str, expected: tuple[str, dict[str, str]]) -> None:
    assert lc.parse_node_spec(spec) == expected


@pytest.mark.parametrize("spec", [":a=1", "n1:novalue", "n1:=x"])
def test_parse_node_spec_rejects(spec: str) -> None:
    with pytest.raises(ValueError):
        lc.parse_node_spec(spec)


def test_binary_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DRA_TESTENV_BIN", raising=False)
    monkeypatch.delenv("DRA_K8S_VERSION", raising=False)
    newest = _listed()[-1]
    assert lc.binary_path() == ROOT / ".cache" / "testenv" / newest / "bin" / "testenv"
    oldest = _listed()[0]
    monkeypatch.setenv("DRA_K8S_VERSION", oldest.removeprefix("v").rsplit(".", 1)[0])
    assert lc.binary_path() == ROOT / ".cache" / "testenv" / oldest / "bin" / "testenv"
    monkeypatch.setenv("DRA_TESTENV_BIN", str(tmp_path / "te"))
    assert lc.binary_path() == tmp_path / "te"


def test_missing_binary_says_make_testenv(tmp_path: Path) -> None:
    cluster = lc.LocalCluster(base_dir=tmp_path, binary=tmp_path / "nope")
    with pytest.raises(lc.ClusterError, match="make testenv"):
        cluster.start()
    with pytest.raises(lc.ClusterError, match="make testenv"):
        _ = cluster.version


def test_tail(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert lc.tail(log, 3) == "line 97\nline 98\nline 99"
    assert lc.tail(tmp_path / "missing") == "(no log)"


def test_stop_rank_orders_etcd_last() -> None:
    names = ["etcd", "kube-apiserver", "kubelet-n1", "kube-scheduler", "driver-x"]
    ordered = sorted(names, key=stop_rank)
    assert ordered[:2] == ["kubelet-n1", "driver-x"]
    assert ordered[-1] == "etcd"
    assert ordered.index("kube-apiserver") > ordered.index("kube-scheduler")


def test_managed_process_stops_whole_group(tmp_path: Path) -> None:
    # A shell that starts a child which ignores SIGTERM: the group must still go.
    script = "trap '' TERM; sleep 60 & echo child $!; wait"
    proc = lc.ManagedProcess("grp", ["sh", "-c", script], tmp_path / "grp.log")
    proc.start()
    lc.wait_for(lambda: proc.log_tail(1).startswith("child "), 10, "child started", proc)
    child = int(proc.log_tail(1).split()[1])
    t0 = time.monotonic()
    proc.stop(timeout=1)
    assert time.monotonic() - t0 < 8
    assert not proc.alive()
    lc.wait_for(lambda: not pid_alive(child), 5, "child gone")


def test_managed_process_signals_its_group_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A node's kubelet is stopped as the cluster's process and as the node's: the second
    stop must not signal the group again, whose number another group may have by then."""
    from devenv.localcluster import processes

    proc = lc.ManagedProcess("once", _SLEEPER, tmp_path / "once.log")
    proc.start()
    proc.stop(timeout=1)
    signalled: list[int] = []
    monkeypatch.setattr(processes.os, "killpg", lambda pgid, sig: signalled.append(sig))
    proc.stop(timeout=1)
    assert signalled == []


def test_a_stop_interrupted_while_waiting_is_finished_by_the_next(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ctrl-C (or SIGTERM, in a test run) during a stop's wait: the fixture's teardown stops
    the process again, and that stop must still escalate to SIGKILL."""
    from devenv.localcluster import processes

    proc = lc.ManagedProcess(
        "stubborn", ["sh", "-c", "trap '' TERM; echo up; sleep 60 & wait"], tmp_path / "s.log"
    )
    proc.start()
    try:
        lc.wait_for(lambda: proc.log_tail(1) == "up", 10, "trap set", proc)

        def interrupted(_: float) -> None:
            raise KeyboardInterrupt

        with monkeypatch.context() as m:
            m.setattr(processes.time, "sleep", interrupted)
            with pytest.raises(KeyboardInterrupt):
                proc.stop(timeout=5)
        proc.stop(timeout=0.5)
        assert not proc.alive()
    finally:
        if proc.alive():
            assert proc.pid is not None
            os.killpg(proc.pid, signal.SIGKILL)


def test_wait_for_reports_log_of_dead_process(tmp_path: Path) -> None:
    proc = lc.ManagedProcess(
        "boom",
        [sys.executable, "-c", "print('exploded here'); raise SystemExit(3)"],
        tmp_path / "b.log",
    )
    proc.start()
    with pytest.raises(lc.ClusterError) as exc:
        lc.wait_for(lambda: False, 10, "never", proc)
    assert "exited (code 3)" in str(exc.value)
    assert "exploded here" in str(exc.value)


def test_wait_for_timeout() -> None:
    with pytest.raises(lc.ClusterError, match="timed out"):
        lc.wait_for(lambda: False, 0.2, "nothing")


def test_managed_process_signal_constant() -> None:
    # stop() defaults to SIGTERM first
    assert lc.ManagedProcess.stop.__defaults__ == (10.0, signal.SIGTERM)


# --- the Kubernetes releases live in testenv/versions only ------------------------------


def _listed() -> tuple[str, ...]:
    return releases.parse_versions(releases.versions_file(ROOT).read_text())


def test_versions_file_lists_one_release_per_minor_from_1_34() -> None:
    listed = _listed()
    minors = [releases.minor_of(v) for v in listed]
    assert minors[0] == 34, "resource.k8s.io/v1 is GA since 1.34: the oldest release tested"
    assert minors == sorted(set(minors)), "one release per minor"


@pytest.mark.parametrize("version", _listed())
def test_each_modfile_agrees_with_its_release(version: str) -> None:
    minor_patch = version.split(".", 1)[1]
    staging = f"v0.{minor_patch}"
    gomod = (ROOT / "testenv" / "mod" / version / "go.mod").read_text()
    assert re.search(rf"^\s*k8s\.io/kubernetes {re.escape(version)}\b", gomod, re.M), (
        f"mod/{version}/go.mod does not require k8s.io/kubernetes {version}; run testenv/pin.sh"
    )
    replaces = re.findall(
        r"^\s*(?:replace\s+)?(k8s\.io/[\w.-]+) => (k8s\.io/[\w.-]+) (v\S+)\s*$", gomod, re.M
    )
    assert len(replaces) >= 25, "staging replace directives missing; run testenv/pin.sh"
    for src, dst, ver in replaces:
        assert src == dst
        assert ver == staging, f"{src} pinned to {ver}, want {staging}; run testenv/pin.sh"
    assert (ROOT / "testenv" / "mod" / version / "go.sum").stat().st_size > 0


def test_go_mod_is_the_newest_release() -> None:
    for name in ("go.mod", "go.sum"):
        link = ROOT / "testenv" / name
        assert link.is_symlink() and link.readlink() == Path("mod") / _listed()[-1] / name


@pytest.mark.parametrize(
    ("want", "expected"),
    [("", "v1.37.2"), ("1.35", "v1.35.4"), ("v1.35", "v1.35.4"), ("1.35.4", "v1.35.4")],
)
def test_resolve_release(want: str, expected: str) -> None:
    listed = ("v1.34.4", "v1.35.4", "v1.36.3", "v1.37.2")
    assert releases.resolve_release(want, listed) == expected


@pytest.mark.parametrize("want", ["1.33", "1.3", "1.35.9", "2.0"])
def test_resolve_release_refuses_unlisted(want: str) -> None:
    with pytest.raises(releases.ReleaseError, match="not listed"):
        releases.resolve_release(want, ("v1.34.4", "v1.35.4"))


def test_parse_versions_sorts_and_refuses_junk() -> None:
    assert releases.parse_versions("# c\nv1.35.4\nv1.34.10 # x\n") == ("v1.34.10", "v1.35.4")
    with pytest.raises(releases.ReleaseError):
        releases.parse_versions("1.35")
    with pytest.raises(releases.ReleaseError):
        releases.parse_versions("# nothing\n")


@pytest.mark.parametrize("want", ["", "1.34", "v1.35", "1.36", _listed()[-1]])
def test_pin_script_resolves_as_python_does(want: str) -> None:
    out = subprocess.run(
        ["bash", str(ROOT / "testenv" / "pin.sh"), "--resolve", want],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == releases.resolve_release(want, _listed())


def test_pin_script_tags_mark_the_newer_releases() -> None:
    def tags(version: str) -> list[str]:
        out = subprocess.run(
            ["bash", str(ROOT / "testenv" / "pin.sh"), "--tags", version],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    listed = _listed()
    assert tags(listed[-1]) == []
    assert tags(listed[0]) == [f"k8spre1.{releases.minor_of(v)}" for v in listed[1:]]


_GATES = {"DRAPartitionableDevices": ("ALPHA", False), "DRAAdminAccess": ("BETA", True)}


@pytest.mark.parametrize(
    ("gate", "minor", "enabled", "expected"),
    [
        ("DRAPartitionableDevices", 34, {"DRAPartitionableDevices"}, None),
        ("DRAPartitionableDevices", 34, set(), "(alpha) is off by default in Kubernetes v1.N"),
        ("DRAListTypeAttributes", 34, set(), "has no DRAListTypeAttributes (new in 1.36)"),
        ("DRAPrioritizedList", 37, set(), None),  # graduated, the gate removed
    ],
)
def test_gate_off_reason(gate: str, minor: int, enabled: set[str], expected: str | None) -> None:
    got = gate_off_reason(gate, version="v1.N", minor=minor, listed=_GATES, enabled=enabled)
    if expected is None:
        assert got is None
    else:
        assert got is not None and expected in got


def test_gate_list_parsing() -> None:
    text = "DRAAdminAccess\tBETA\tdefault=true\tDRA\nDRADeviceTaints\tALPHA\tdefault=false\tDRA\n"
    assert lc_cluster.parse_gate_list(text) == {
        "DRAAdminAccess": ("BETA", True),
        "DRADeviceTaints": ("ALPHA", False),
    }


def test_pin_script_check_mode() -> None:
    if not (ROOT / "testenv" / "pin.sh").is_file():
        pytest.skip("pin.sh missing")
    out = subprocess.run(
        ["bash", str(ROOT / "testenv" / "pin.sh"), "--check"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr


# --- `python -m devenv.localcluster up` --------------------------------------------------

_SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]


def _fake_control_plane(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[lc.ManagedProcess]:
    """Make `LocalCluster.start` spawn one sleeper instead of a control plane."""
    from devenv.localcluster import cli

    started: list[lc.ManagedProcess] = []

    def start(self: lc.LocalCluster) -> None:
        started.append(self.spawn("etcd", _SLEEPER))

    monkeypatch.setattr(lc.LocalCluster, "start", start)
    monkeypatch.setattr(cli, "state_dir", lambda: tmp_path / "state")
    return started


def test_up_stops_the_control_plane_when_a_node_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from devenv.localcluster import cli

    started = _fake_control_plane(monkeypatch, tmp_path)

    def add_node(self: lc.LocalCluster, name: str, *_: object, **__: object) -> lc.NodeHandle:
        raise lc.ClusterError(f"timed out waiting for node {name} Ready")

    monkeypatch.setattr(lc.LocalCluster, "add_node", add_node)
    try:
        rc = cli.main(["up", "--base-dir", str(tmp_path / "run"), "--node", "n1"])
        assert rc == 1
        assert "node n1 Ready" in capsys.readouterr().err
        # No state was saved, so `down` could not stop what is left: nothing may be left.
        assert not (tmp_path / "state" / cli.STATE_FILE).exists()
        assert started and not started[0].alive()
    finally:
        for proc in started:
            proc.stop(timeout=1)


def test_up_checks_node_specs_before_starting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from devenv.localcluster import cli

    started = _fake_control_plane(monkeypatch, tmp_path)
    try:
        rc = cli.main(["up", "--base-dir", str(tmp_path / "run"), "--node", "n1:novalue"])
        assert rc != 0
        assert "novalue" in capsys.readouterr().err
        assert started == []
    finally:
        for proc in started:
            proc.stop(timeout=1)


def _refused_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """Make `LocalCluster.start` record its directory and fail (there is no control plane)."""
    from devenv.localcluster import cli

    starts: list[Path] = []

    def start(self: lc.LocalCluster) -> None:
        assert self.base_dir is not None
        starts.append(self.base_dir)
        raise lc.ClusterError("no control plane in this test")

    monkeypatch.setattr(lc.LocalCluster, "start", start)
    monkeypatch.setattr(cli, "state_dir", lambda: tmp_path / "state")
    return starts


@pytest.mark.parametrize("kind", ["directory of other files", "dangling symlink"])
def test_up_refuses_a_base_dir_that_is_not_a_clusters(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    """`up` clears its state directory before starting: a ``--base-dir`` naming a directory
    of the user's (or a symlink, whose removal would not remove what it names) must be
    refused, not removed."""
    from devenv.localcluster import cli

    starts = _refused_start(monkeypatch, tmp_path)
    base = tmp_path / "home"
    if kind == "dangling symlink":
        base.symlink_to(tmp_path / "nowhere")
    else:
        base.mkdir()
        (base / "notes.txt").write_text("keep me")
    assert cli.main(["up", "--base-dir", str(base)]) == 2
    assert "name a new or empty directory" in capsys.readouterr().err
    assert starts == []
    if kind != "dangling symlink":
        assert (base / "notes.txt").read_text() == "keep me"


def test_up_keeps_an_empty_base_dir_it_is_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--base-dir .`` in an empty directory: the directory is used, not removed (which
    would pull the working directory from under the process)."""
    from devenv.localcluster import cli

    starts = _refused_start(monkeypatch, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert cli.main(["up", "--base-dir", "."]) == 1
    assert starts == [Path(".")]
    assert work.is_dir() and (work / cli.BASE_MARK).is_file()


def test_up_clears_a_base_dir_an_earlier_up_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from devenv.localcluster import cli

    starts = _refused_start(monkeypatch, tmp_path)
    base = tmp_path / "run"
    assert cli.main(["up", "--base-dir", str(base)]) == 1
    (base / "stale.log").write_text("from the last cluster")
    assert cli.main(["up", "--base-dir", str(base)]) == 1
    assert starts == [base, base]
    assert not (base / "stale.log").exists()


def test_probes_take_an_answer_that_is_not_http_as_not_ready() -> None:
    """A component restarting on its port can answer garbage or close mid-answer: the
    probe says "not ready" and the wait goes on, instead of a traceback ending it."""
    import socket
    import threading

    from devenv.localcluster.probes import http_ok

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def answer() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            conn.recv(4096)
            conn.sendall(b"garbage\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        assert http_ok(f"http://127.0.0.1:{port}/health") is False
        assert http_ok(f"http://127.0.0.1:{port}/health") is False
    finally:
        server.close()
        thread.join(timeout=5)


def _state_with(tmp_path: Path, pid: int, identity: str | None) -> None:
    from devenv.localcluster import cli

    (tmp_path / "state").mkdir(exist_ok=True)
    state = {
        "base_dir": str(tmp_path / "run"),
        "kubeconfig": str(tmp_path / "run" / "kubeconfig"),
        "processes": {"etcd": pid},
        "identities": {"etcd": identity},
    }
    (tmp_path / "state" / cli.STATE_FILE).write_text(json.dumps(state))


@pytest.mark.parametrize("same", [True, False])
def test_down_stops_only_the_processes_up_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, same: bool
) -> None:
    """A recorded PID can belong to another process by the time `down` runs (the machine
    rebooted, the PID was reused): that process is not the cluster's to stop."""
    from devenv.localcluster import cli
    from devenv.localcluster.processes import process_identity

    monkeypatch.setattr(cli, "state_dir", lambda: tmp_path / "state")
    proc = lc.ManagedProcess("other", _SLEEPER, tmp_path / "other.log")
    proc.start()
    try:
        assert proc.pid is not None
        identity = process_identity(proc.pid)
        assert identity is not None
        _state_with(tmp_path, proc.pid, identity if same else identity + "0")
        assert cli.main(["down"]) == 0
        deadline = time.monotonic() + 5
        while same and proc.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.alive() is not same
        assert not (tmp_path / "state" / cli.STATE_FILE).exists()
    finally:
        proc.stop(timeout=1)
