#!/usr/bin/env python3
"""Run a `go build` or `go install` with a banner, live progress and a closing line.

    python3 hack/buildprogress.py --key testenv --name "testenv v1.37.1" \\
        --why "the local control plane for make demo and the e2e tests" -- go build ...

1. The packages the build will compile: the same command with -n prints a "# <package>"
   header for every package that is not in Go's build cache (and downloads missing
   modules, counted on the way), so the count is exact on a cold, a partly warm and a warm
   cache alike. It takes about a second with the modules downloaded.
2. Unless that found a quick build (under QUIET_SECONDS by the table), a banner within
   QUIET_WAIT seconds: what is built, why, how long it took on this project's 2-core
   machine (TYPICAL below), then the packages to compile with an estimate.
3. The command itself with -v, which makes Go print each package as it starts compiling:
   "testenv v1.37.1: 312/2651 packages compiled, 4m10s", rewritten in place every second
   on a terminal, one line every 30 s otherwise (BUILDPROGRESS_INTERVAL) so that logs stay
   short. Under a parallel make (-jN) a terminal gets lines too, every 15 s.
4. "testenv v1.37.1: built in 11m00s (2651 packages compiled)", or the failure with the
   command to re-run. A quick build prints this line only.

Everything Go prints that is not a package name (compiler errors, "go: ..." messages)
passes through unchanged; the exit status is the build's. BUILDPROGRESS=0 runs the command
plainly. Standard library only: it runs with the system python3, before any venv exists.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TextIO


@dataclass(frozen=True)
class Typical:
    """Measured on the project's machine: 2 cores, 24 GiB, Go 1.26.8 (see testenv/README.md)."""

    cold: float  # seconds from an empty GOCACHE, modules already downloaded
    warm: float  # seconds when every dependency is cached (compile the main package, link)
    packages: int  # packages compiled from an empty GOCACHE (as the dry run counts them)


TYPICAL: dict[str, Typical] = {
    # testenv: measured with the machine loaded by other work (load average 4-5); alone it
    # took 6m20s. The others with load average 2-3. testenv/README.md has the details.
    "testenv": Typical(cold=660, warm=12, packages=2651),
    "celref": Typical(cold=78, warm=3, packages=427),
    "containerd": Typical(cold=96, warm=6, packages=1028),
    "runc": Typical(cold=24, warm=2, packages=228),
    "cni": Typical(cold=16, warm=2, packages=155),
    "pause": Typical(cold=8, warm=1, packages=56),
    "helm": Typical(cold=117, warm=8, packages=963),
    "kustomize": Typical(cold=33, warm=3, packages=387),
}

# Builds estimated under QUIET_SECONDS print one line, when the dry run answers in QUIET_WAIT.
QUIET_SECONDS = 20.0
QUIET_WAIT = 1.5
# For a build without a row in TYPICAL: testenv's cold rate.
SECONDS_PER_PACKAGE = 0.25

# Set by the Makefile recipes; part of the command printed after a failure.
REPLAY_ENV = ("GOBIN", "CGO_ENABLED", "GOFLAGS", "GOCACHE")

# A line of `go build -v` output: an import path and nothing else.
PACKAGE_LINE = re.compile(r"[A-Za-z0-9_.~+-]+(?:/[A-Za-z0-9_.~+-]+)*")


def duration(seconds: float) -> str:
    """4m10s, 38s, 1h02m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def about(seconds: float) -> str:
    """A rough figure: about 40 s, about 7 min."""
    if seconds < 10:
        return "a few seconds"
    if seconds < 90:
        return f"about {round(seconds / 5) * 5} s"
    return f"about {round(seconds / 60)} min"


def packages(n: int) -> str:
    return f"{n} package" if n == 1 else f"{n} packages"


def with_flag(cmd: list[str], flag: str) -> list[str] | None:
    """cmd with flag right after its `build`/`install` subcommand, or None if it has none."""
    for i, arg in enumerate(cmd[1:], start=1):
        if arg in ("build", "install"):
            return [*cmd[: i + 1], flag, *cmd[i + 1 :]]
        if not arg.startswith("-"):
            return None
    return None


@dataclass
class DryRun:
    """What `go build -n` would do: the packages it compiles, which of them are commands."""

    packages: set[str] = field(default_factory=set)
    mains: set[str] = field(default_factory=set)
    downloads: int = 0

    @property
    def libraries(self) -> int:
        """The packages the progress counts: `go build -v` does not print a command's own."""
        return len(self.packages - self.mains)


def parse_dry_run(lines: Iterable[str], on_download: Callable[[int], None]) -> DryRun:
    """Each package a `go build -n` listing compiles is introduced by "#", "# pkg", "#"."""
    dry = DryRun()
    previous = current = ""
    for raw in lines:
        line = raw.rstrip("\n")
        if line.startswith("go: downloading "):
            dry.downloads += 1
            on_download(dry.downloads)
        elif previous == "#" and line.startswith("# ") and " " not in line[2:]:
            current = line[2:]
            dry.packages.add(current)
        elif current and "/compile " in line and " -p main " in line:
            dry.mains.add(current)
        previous = line
    return dry


def count_to_compile(
    cmd: list[str], cwd: str | None, on_download: Callable[[int], None]
) -> DryRun | None:
    """What `cmd` would compile (its dry run with -n), or None when that cannot tell."""
    dry = with_flag(cmd, "-n")
    if dry is None:
        return None
    try:
        proc = subprocess.Popen(
            dry,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
    except OSError:
        return None
    assert proc.stdout is not None
    found = parse_dry_run(proc.stdout, on_download)
    return found if proc.wait() == 0 else None


class Progress:
    """The status line(s) of one build; clock and output are injectable for the tests."""

    def __init__(
        self,
        name: str,
        total: int | None,
        out: TextIO,
        *,
        tty: bool,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        width: int = 100,
    ) -> None:
        self.name = name
        self.total = total  # the -v lines to expect (None: unknown)
        self.expected: int | None = None  # every package the build compiles, for the last line
        self.out = out
        self.tty = tty
        self.interval = interval
        self.clock = clock
        self.width = width
        self.start = clock()
        self.compiled = 0
        self.current = ""
        self.shown = False  # a rewritable status line is on screen (tty)
        self.last_shown = self.start

    def status(self, text: str) -> None:
        """A message before the build proper (counting, downloading): rewritten on a terminal,
        at most one line per interval otherwise."""
        if self.tty:
            self._draw(f"{self.name}: {text}")
        elif self.clock() - self.last_shown >= self.interval:
            self.out.write(f"{self.name}: {text}\n")
            self.out.flush()
            self.last_shown = self.clock()

    def package(self, name: str) -> None:
        self.compiled += 1
        self.current = name

    def passthrough(self, line: str) -> None:
        self.clear()
        self.out.write(line if line.endswith("\n") else line + "\n")
        self.out.flush()

    def linking(self) -> bool:
        return self.total is not None and self.compiled >= self.total

    def text(self) -> str:
        took = duration(self.clock() - self.start)
        if self.total is None:
            return f"{self.name}: {self.compiled} packages compiled, {took}"
        if self.total == 0:
            return f"{self.name}: dependencies cached, linking, {took}"
        if self.linking():
            return f"{self.name}: {self.total}/{self.total} packages compiled, linking, {took}"
        return f"{self.name}: {self.compiled}/{self.total} packages compiled, {took}"

    def tick(self) -> None:
        now = self.clock()
        if self.tty:
            if now - self.last_shown >= 1 or not self.shown:
                text = self.text()
                if self.current and not self.linking():
                    text += f" ({self.current})"
                self._draw(text)
                self.last_shown = now
        elif now - self.last_shown >= self.interval:
            self.out.write(self.text() + "\n")
            self.out.flush()
            self.last_shown = now

    def finish(self, returncode: int, cmd: list[str], cwd: str | None) -> None:
        self.clear()
        took = duration(self.clock() - self.start)
        if returncode == 0:
            # what the dry run listed (a command's own package may or may not be printed)
            n = self.compiled if self.expected is None else self.expected
            what = f"{packages(n)} compiled" if n else "dependencies cached"
            self.out.write(f"{self.name}: built in {took} ({what})\n")
        else:
            where = f"cd {shlex.quote(cwd or os.getcwd())} && "
            env = "".join(
                f"{k}={shlex.quote(os.environ[k])} " for k in REPLAY_ENV if k in os.environ
            )
            self.out.write(
                f"{self.name}: FAILED after {took} (exit status {returncode}); the command:\n"
                f"  {where}{env}{shlex.join(cmd)}\n"
            )
        self.out.flush()

    def _draw(self, text: str) -> None:
        if len(text) > self.width - 1:
            text = text[: self.width - 2] + "…"
        self.out.write("\r\033[K" + text)
        self.out.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.out.write("\r\033[K")
            self.shown = False


def banner(name: str, why: str, typical: Typical | None) -> str:
    line = f"{name}: building {why}" if why else f"{name}: building"
    if typical:
        line += (
            f"\n{name}: on 2 cores this took {duration(typical.cold)} from an empty Go cache"
            f" ({typical.packages} packages), {duration(typical.warm)} with a warm one"
        )
    return line


def estimate(to_compile: int, typical: Typical | None) -> float:
    """Seconds, scaled between the measured warm and cold builds by the packages to compile."""
    if typical is None:
        return to_compile * SECONDS_PER_PACKAGE
    share = min(1.0, to_compile / typical.packages)
    return typical.warm + share * (typical.cold - typical.warm)


def plan(name: str, to_compile: int, typical: Typical | None) -> str:
    """What the dry run found, with an estimate scaled from the measured figures."""
    if typical is None:
        return f"{name}: {packages(to_compile)} to compile"
    took = about(estimate(to_compile, typical))
    if to_compile <= 1:
        return f"{name}: dependencies cached; compile and link ({took})"
    return f"{name}: {packages(to_compile)} to compile ({took})"


class Counting:
    """count_to_compile in a thread, so that a slow one (downloads) does not delay the banner."""

    def __init__(self, cmd: list[str], cwd: str | None) -> None:
        self.result: DryRun | None = None
        self.downloads = 0
        self.thread = threading.Thread(target=self._run, args=(cmd, cwd), daemon=True)
        self.thread.start()

    def _run(self, cmd: list[str], cwd: str | None) -> None:
        self.result = count_to_compile(cmd, cwd, self._downloaded)

    def _downloaded(self, n: int) -> None:
        self.downloads = n

    def wait(self, seconds: float) -> bool:
        self.thread.join(seconds)
        return not self.thread.is_alive()


def run(
    cmd: list[str],
    name: str,
    why: str,
    key: str,
    out: TextIO,
    *,
    tty: bool,
    interval: float,
    cwd: str | None = None,
    quiet_wait: float = QUIET_WAIT,
) -> int:
    typical = TYPICAL.get(key)
    t0 = time.monotonic()
    progress = Progress(name, None, out, tty=tty, interval=interval, width=_width())
    dry = Counting(cmd, cwd)
    # A build that is quick anyway (everything cached but a package or two) gets one line.
    quiet = (
        dry.wait(quiet_wait)
        and dry.result is not None
        and estimate(dry.result.libraries, typical) < QUIET_SECONDS
    )
    if not quiet:
        out.write(banner(name, why, typical) + "\n")
        out.flush()
        while not dry.wait(0.25):
            n = dry.downloads
            progress.status(
                f"downloading Go modules ({n})…" if n else "counting the packages to compile…"
            )
        progress.clear()
    to_compile = dry.result
    if not quiet and to_compile is not None and to_compile.libraries > 1:
        out.write(plan(name, to_compile.libraries, typical) + "\n")
        out.flush()
    progress = Progress(
        name,
        to_compile.libraries if to_compile is not None else None,
        out,
        tty=tty,
        interval=interval,
        width=_width(),
    )
    progress.expected = to_compile.libraries if to_compile is not None else None
    progress.start = t0
    verbose = with_flag(cmd, "-v") or cmd
    try:
        proc = subprocess.Popen(
            verbose,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
    except OSError as e:
        out.write(f"{name}: cannot run {cmd[0]}: {e}\n")
        return 127
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                progress.tick()
                continue
            if line is None:
                break
            if PACKAGE_LINE.fullmatch(line.rstrip("\n")):
                progress.package(line.strip())
            else:
                progress.passthrough(line)
            progress.tick()
        returncode = proc.wait()
    except KeyboardInterrupt:
        proc.wait()
        progress.clear()
        raise
    progress.finish(returncode, cmd, cwd)
    return returncode


def _width() -> int:
    return shutil.get_terminal_size((100, 24)).columns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True, help="what is built, e.g. 'testenv v1.37.1'")
    parser.add_argument("--why", default="", help="why it is built (one phrase)")
    parser.add_argument("--key", default="", help="row of the timing table (default: --name)")
    parser.add_argument("--cwd", default=None, help="directory to run the command in")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- go build|install ...")
    args = parser.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        parser.error("no command given")
    if os.environ.get("BUILDPROGRESS", "1") == "0":
        print(f"{args.name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        return subprocess.call(cmd, cwd=args.cwd)
    parallel_make = "jobserver" in os.environ.get("MAKEFLAGS", "")
    tty = sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
    interval = float(os.environ.get("BUILDPROGRESS_INTERVAL") or (15 if tty else 30))
    try:
        return run(
            cmd,
            args.name,
            args.why,
            args.key or args.name,
            sys.stderr,
            tty=tty and not parallel_make,
            interval=interval,
            cwd=args.cwd,
        )
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
