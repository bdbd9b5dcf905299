"""hack/buildprogress.py: counting what a Go build compiles, its progress lines, its exit status.

A fake `go` (a small Python script) stands in for the toolchain: with -n it prints a dry-run
listing, with -v the package names, optionally an error and a non-zero exit status.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "buildprogress.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("buildprogress", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bp = _module()

DRY_RUN = """\
go: downloading example.com/dep v1.0.0
go: downloading example.com/other v1.2.0
mkdir -p $WORK/b006/

#
# internal/goarch
#

echo '# import config' > $WORK/b006/importcfg # internal
/go/pkg/tool/linux_amd64/compile -o $WORK/b006/_pkg_.a -p internal/goarch -std -complete
cat >$WORK/b005/importcfg << 'EOF' # internal
# import config
packagefile internal/goarch=$WORK/b006/_pkg_.a
EOF

#
# example.com/dep/lib
#

/go/pkg/tool/linux_amd64/compile -o $WORK/b002/_pkg_.a -p example.com/dep/lib -complete

#
# example.com/cmd/tool
#

/go/pkg/tool/linux_amd64/compile -o $WORK/b001/_pkg_.a -p main -complete
/go/pkg/tool/linux_amd64/link -o $WORK/b001/exe/a.out
"""

FAKE_GO = """\
#!{python}
import os, sys, time
args = sys.argv[1:]
if "-n" in args:
    sys.stderr.write({dry!r})
    sys.exit(int(os.environ.get("FAKE_GO_DRY_RC", "0")))
assert "-v" in args, args
for pkg in ["internal/goarch", "example.com/dep/lib"]:
    sys.stderr.write(pkg + "\\n")
    sys.stderr.flush()
    time.sleep(float(os.environ.get("FAKE_GO_DELAY", "0")))
if os.environ.get("FAKE_GO_ERROR"):
    sys.stderr.write("# example.com/cmd/tool\\n./main.go:3:2: undefined: nope\\n")
    sys.exit(1)
sys.exit(0)
"""


@pytest.fixture
def fake_go(tmp_path: Path) -> Path:
    go = tmp_path / "go"
    go.write_text(FAKE_GO.format(python=sys.executable, dry=DRY_RUN))
    go.chmod(0o755)
    return go


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_flags_go_right_after_the_subcommand() -> None:
    cmd = ["go", "build", "-modfile=m", "-o", "x", "./cmd/x"]
    assert bp.with_flag(cmd, "-v") == ["go", "build", "-v", "-modfile=m", "-o", "x", "./cmd/x"]
    assert bp.with_flag(["go", "install", "a@v1"], "-n") == ["go", "install", "-n", "a@v1"]
    assert bp.with_flag(["go", "vet", "./..."], "-n") is None
    assert bp.with_flag(["make", "all"], "-n") is None


def test_dry_run_lists_the_packages_to_compile_and_the_commands() -> None:
    downloads: list[int] = []
    dry = bp.parse_dry_run(io.StringIO(DRY_RUN), downloads.append)
    assert dry.packages == {"internal/goarch", "example.com/dep/lib", "example.com/cmd/tool"}
    assert dry.mains == {"example.com/cmd/tool"}
    assert dry.libraries == 2  # what `go build -v` prints for sure
    assert downloads == [1, 2]
    # a warm cache: no banner at all
    assert bp.parse_dry_run(io.StringIO("mkdir -p $WORK/b001/\n"), print).packages == set()


def test_durations_and_estimates() -> None:
    assert bp.duration(38.4) == "38s"
    assert bp.duration(250) == "4m10s"
    assert bp.duration(3720) == "1h02m"
    assert bp.about(3) == "a few seconds"
    assert bp.about(42) == "about 40 s"
    assert bp.about(420) == "about 7 min"
    typical = bp.Typical(cold=400, warm=10, packages=1000)
    assert bp.plan("x", 1000, typical) == "x: 1000 packages to compile (about 7 min)"
    assert bp.plan("x", 100, typical) == "x: 100 packages to compile (about 50 s)"
    assert bp.plan("x", 0, typical) == "x: dependencies cached; compile and link (about 10 s)"
    assert bp.plan("x", 7, None) == "x: 7 packages to compile"
    assert "from an empty Go cache (1000 packages)" in bp.banner("x", "why", typical)
    assert bp.banner("x", "the thing", None) == "x: building the thing"


def test_lines_for_logs_come_once_per_interval() -> None:
    out, clock = io.StringIO(), Clock()
    p = bp.Progress("testenv v1.37.1", 1480, out, tty=False, interval=30, clock=clock)
    for i in range(312):
        clock.now += 0.5
        p.package(f"pkg/{i}")
        p.tick()
    # 156 s: lines at 30, 60, 90, 120 and 150 s
    lines = out.getvalue().splitlines()
    assert len(lines) == 5
    assert lines[-1] == "testenv v1.37.1: 300/1480 packages compiled, 2m30s"
    clock.now += 94
    p.tick()
    assert out.getvalue().splitlines()[-1] == "testenv v1.37.1: 312/1480 packages compiled, 4m10s"
    p.compiled = 1480
    assert p.text().endswith("1480/1480 packages compiled, linking, 4m10s")
    p.expected = 1480
    assert bp.Progress("x", 0, out, tty=False, interval=30, clock=clock).text() == (
        "x: dependencies cached, linking, 0s"
    )
    p.finish(0, ["go", "build"], None)
    assert (
        out.getvalue().splitlines()[-1]
        == "testenv v1.37.1: built in 4m10s (1480 packages compiled)"
    )


def test_a_terminal_gets_one_line_rewritten_and_errors_on_their_own_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in bp.REPLAY_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOBIN", "/o ut")
    out, clock = io.StringIO(), Clock()
    p = bp.Progress("celref", 10, out, tty=True, interval=30, clock=clock, width=60)
    p.package("k8s.io/api/core/v1")
    p.tick()
    assert out.getvalue() == "\r\033[Kcelref: 1/10 packages compiled, 0s (k8s.io/api/core/v1)"
    p.package("a")
    p.tick()  # less than a second later: not redrawn
    assert out.getvalue().count("\r") == 1
    p.passthrough("./main.go:3:2: undefined: nope\n")
    assert out.getvalue().endswith("\r\033[K./main.go:3:2: undefined: nope\n")
    clock.now += 1
    p.package("example.com/a/very/long/package/path/that/does/not/fit/the/terminal")
    p.tick()
    last = out.getvalue().rsplit("\r\033[K", 1)[1]
    assert len(last) == 59 and last.endswith("…")
    p.finish(2, ["go", "build", "./x"], "/src")
    assert out.getvalue().endswith(
        "\r\033[Kcelref: FAILED after 1s (exit status 2); the command:\n"
        "  cd /src && GOBIN='/o ut' go build ./x\n"
    )


def test_run_counts_passes_errors_through_and_keeps_the_status(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a long build by the table: the banner, the plan, the done line
    monkeypatch.setitem(bp.TYPICAL, "long", bp.Typical(cold=600, warm=30, packages=2))
    out = io.StringIO()
    cmd = [str(fake_go), "build", "-o", "x", "./cmd/tool"]
    rc = bp.run(cmd, "tool", "a test", "long", out, tty=False, interval=30)
    assert rc == 0
    assert out.getvalue().splitlines() == [
        "tool: building a test",
        "tool: on 2 cores this took 10m00s from an empty Go cache (2 packages), 30s with a warm one",
        "tool: 2 packages to compile (about 10 min)",
        "tool: built in 0s (2 packages compiled)",
    ]
    # the same with an error: it passes through, the status is the build's
    monkeypatch.setenv("FAKE_GO_ERROR", "1")
    out = io.StringIO()
    rc = bp.run(cmd, "tool", "", "long", out, tty=False, interval=30)
    assert rc == 1
    text = out.getvalue()
    assert "# example.com/cmd/tool\n./main.go:3:2: undefined: nope\n" in text
    assert "internal/goarch" not in text
    assert "tool: FAILED after 0s (exit status 1); the command:" in text


def test_a_quick_build_says_one_line(fake_go: Path) -> None:
    out = io.StringIO()
    cmd = [str(fake_go), "build", "-o", "x", "./cmd/tool"]
    assert bp.run(cmd, "tool", "a test", "celref", out, tty=False, interval=30) == 0
    assert out.getvalue() == "tool: built in 0s (2 packages compiled)\n"
    # unless the dry run does not answer at once
    out = io.StringIO()
    assert bp.run(cmd, "tool", "a test", "celref", out, tty=False, interval=30, quiet_wait=0) == 0
    assert out.getvalue().startswith("tool: building a test\ntool: on 2 cores this took 1m18s")


def test_a_failing_dry_run_still_builds_without_a_total(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GO_DRY_RC", "1")
    monkeypatch.setenv("FAKE_GO_DELAY", "0.3")
    out = io.StringIO()
    rc = bp.run([str(fake_go), "install", "x@v1"], "x", "", "nokey", out, tty=False, interval=0.2)
    assert rc == 0
    lines = out.getvalue().splitlines()
    assert "packages to compile" not in out.getvalue()
    assert any(re.fullmatch(r"x: [12] packages compiled, \ds", line) for line in lines), lines
    assert re.fullmatch(r"x: built in \ds \(2 packages compiled\)", lines[-1]), lines


def test_the_script_runs_with_plain_python(fake_go: Path, tmp_path: Path) -> None:
    env = {**os.environ, "FAKE_GO_ERROR": "1"}
    env.pop("MAKEFLAGS", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            str(SCRIPT),
            "--key",
            "celref",
            "--name",
            "celref v1",
            "--why",
            "a test",
            "--",
            str(fake_go),
            "build",
            "./cmd/tool",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("# example.com/cmd/tool\n./main.go:3:2: undefined: nope\n")
    assert f"celref v1: FAILED after 0s (exit status 1); the command:\n  cd {tmp_path} && " in (
        proc.stderr
    )
    assert "undefined: nope" in proc.stderr
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--name", "plain", "--", str(fake_go), "build", "-v"],
        capture_output=True,
        text=True,
        env={**os.environ, "BUILDPROGRESS": "0"},
        timeout=30,
    )
    assert proc.returncode == 0
    assert proc.stderr.splitlines()[0] == f"plain: {fake_go} build -v"
    assert "internal/goarch" in proc.stderr  # unfiltered


def test_the_makefiles_wrap_every_go_build() -> None:
    """Each `go build`/`go install` recipe runs under the script, with a row of its table."""
    wrapped = 0
    for fragment in ("testenv/testenv.mk", "testenv/node.mk", "hack/tools.mk"):
        lines = (ROOT / fragment).read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(
                r"\t.*\$\((TESTENV_GO|TOOLS_GO)\) (build|install)\b|\t.*\$\(TESTENV_BUILD\)", line
            ):
                call = re.search(r"(go_progress|TOOLS_PROGRESS),(\w+),", lines[i - 1])
                assert call, f"{fragment}: {line.strip()} runs without hack/buildprogress.py"
                assert call.group(2) in bp.TYPICAL, lines[i - 1]
                wrapped += 1
    assert wrapped == 8  # testenv, celref, containerd, runc, CNI, pause, helm, kustomize
