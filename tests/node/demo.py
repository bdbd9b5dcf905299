"""Run the examples on the real node and print what each container saw (``make demo-node``).

    python -m tests.node.demo [--base /var/lib/dra-node]

Each example's pods run the probe of `tests.node.probe` in the busybox image; for every
container this prints the devices allocated to its pod, its ``NVIDIA_*``/``CUDA_*``
environment and its NVIDIA device nodes, as read from the pod log.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.node.probe import Node

#: Example, containers of its pods, whether its namespace needs admin access.
EXAMPLES: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("single-gpu", ("app",), False),
    ("mig-1g10gb", ("app",), False),
    ("time-slicing", ("trainer", "evaluator"), False),
    ("mps", ("client-a", "client-b"), False),
    ("admin-access", ("monitor",), True),
)
ENV_PREFIXES = ("NVIDIA_", "CUDA_")


def show(node: Node, namespace: str, pod: str, containers: Sequence[str]) -> None:
    # The pod's claims are in its status once its containers run: read the logs first.
    seen = {name: node.seen(namespace, pod, name) for name in containers}
    devices = ", ".join(f"{d.pool}/{d.device}" for d in node.allocated(namespace, pod))
    print(f"  pod {pod}: {devices}")
    for name, probe in seen.items():
        print(f"    container {name}:")
        for key, value in sorted(probe.env.items()):
            if key.startswith(ENV_PREFIXES):
                print(f"      {key}={value}")
        for path, (major, minor) in sorted(probe.devices.items()):
            print(f"      {path} {major}:{minor}")


def run_example(node: Node, name: str, containers: Sequence[str], admin: bool) -> None:
    ns = node.new_namespace(f"demo-{name}-")
    try:
        if admin:
            label = {"resource.kubernetes.io/admin-access": "true"}
            node.core.patch_namespace(ns, {"metadata": {"labels": label}})
        print(f"example {name}:")
        for pod in node.apply_example(name, ns):
            show(node, ns, pod, containers)
    finally:
        node.delete_namespace(ns)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, default=Path("/var/lib/dra-node"))
    args = parser.parse_args(argv)
    node = Node.from_state(args.base)
    for name, containers, admin in EXAMPLES:
        run_example(node, name, containers, admin)
    ns = node.new_namespace("demo-extended-")
    try:
        print("example extended resource (nvidia.com/gpu: 1 in resources.limits):")
        node.run_pod(ns, "extended", resources={"limits": {"nvidia.com/gpu": "1"}})
        show(node, ns, "extended", ("app",))
    finally:
        node.delete_namespace(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
