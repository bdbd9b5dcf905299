"""The ``dra-driver`` subcommands, their flags and the parser built from them."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from dra_driver import exitcodes, package_version
from dra_driver.bindsettings import RUN_FIELDS
from dra_driver.cel_commands import EXPLAIN_CLAIM, MATCH
from dra_driver.cliparser import Parser, apply_environment
from dra_driver.command import Command
from dra_driver.output import camel_keys, print_objects
from dra_driver.settings import Settings, SettingsError, add_arguments, from_namespace

# Each command imports what it needs when it runs, so building the parser stays quick.

_DISCOVERY = ("backend", "profile", "node_name")
_LOGGING = ("log_format", "log_level")


def _discover(settings: Settings, _: argparse.Namespace) -> int:
    from dra_driver.gpu.discovery.factory import make_discovery
    from dra_driver.gpu.discovery.table import inventory_table

    inventory = make_discovery(
        settings.backend, node_name=settings.node_name or "node", profile=settings.profile
    ).discover()
    if settings.output == "table":
        print(inventory_table(inventory))
    else:
        print_objects(camel_keys(inventory.model_dump(mode="json")), settings.output)
    return 0


def _slices(settings: Settings, _: argparse.Namespace) -> int:
    from dra_driver.gpu.discovery.factory import make_discovery
    from dra_driver.gpu.publish.catalog import build_catalog
    from dra_driver.gpu.publish.profiles import published_inventory
    from dra_driver.gpu.sharing.selection import parse_selection
    from dra_driver.gpu.sharing.shared_gpus import shared_uuids
    from dra_driver.resourceslice.pool import render_pool

    if not settings.node_name:
        raise SettingsError("--node-name (DRA_NODE_NAME) is required")
    inventory = make_discovery(
        settings.backend, node_name=settings.node_name, profile=settings.profile
    ).discover()
    inventory = published_inventory(inventory, settings.dynamic_mig, settings.mig_profiles)
    catalog = build_catalog(
        inventory,
        dynamic=settings.dynamic_mig,
        shared=shared_uuids(inventory, parse_selection(settings.shared_gpus)),
        layout=settings.mig_layout,
    )
    slices = render_pool(
        catalog.pool(
            settings.node_name,
            settings.driver_name,
            list_attributes=settings.list_attributes,
            legacy_nvidia=settings.compat == "nvidia",
        )
    )
    if settings.output == "table":
        from dra_driver.resourceslice.table import slices_table

        print(slices_table(slices, settings.driver_name))
    else:
        print_objects(slices, settings.output)
    return 0


def _run(settings: Settings, _: argparse.Namespace) -> int:
    # Reached when the quick reading of the command line was unsure (dra_driver.cli).
    from dra_driver.launch import run_checked_agent

    return asyncio.run(run_checked_agent(settings))


def _cleanup(settings: Settings, _: argparse.Namespace) -> int:
    from dra_driver.kube import KubeClient
    from dra_driver.resourceslice.cleanup import delete_pool_slices

    if not settings.node_name:
        raise SettingsError("--node-name (DRA_NODE_NAME) is required")

    async def cleanup() -> int:
        client = await KubeClient.create(settings.kubeconfig, context=settings.context)
        try:
            return await delete_pool_slices(client, settings.node_name, settings.driver_name)
        finally:
            await client.close()

    count = asyncio.run(cleanup())
    print(
        f"deleted {count} ResourceSlice(s) of driver {settings.driver_name} on {settings.node_name}"
    )
    return 0


def _compute_domain_plugin(settings: Settings, _: argparse.Namespace) -> int:
    from dra_driver.computedomain.nodelaunch import run_compute_domain_plugin

    return asyncio.run(run_compute_domain_plugin(settings))


def _compute_domain_controller(settings: Settings, _: argparse.Namespace) -> int:
    from dra_driver.computedomain.launch import run_controller_process

    return asyncio.run(run_controller_process(settings))


def _imex_daemon(settings: Settings, ns: argparse.Namespace) -> int:
    if ns.check:
        # The readiness probe, every 2 s: only the check's own small module.
        from dra_driver.computedomain.imexconfig import run_check

        return run_check(settings.driver_root, ns.imex_dir)
    from dra_driver.computedomain.daemon import run_process

    return asyncio.run(run_process(settings, ns))


def _imex_daemon_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="the pod's probe: exit 0 when this pod's IMEX daemon is READY, else 1",
    )
    for flag, text in (
        ("--domain-uid", "the compute domain's UID (env DRA_DOMAIN_UID)"),
        ("--domain", "the compute domain as namespace/name, for logs (env DRA_DOMAIN)"),
        ("--pod-ip", "this pod's IP, the daemon's address (env DRA_POD_IP, else POD_IP)"),
        (
            "--pod-namespace",
            "the namespace of the domain's daemon pods (env DRA_POD_NAMESPACE, else POD_NAMESPACE)",
        ),
        (
            "--imex-dir",
            "writable directory for the daemon's files (default /run/imex; env DRA_IMEX_DIR)",
        ),
    ):
        parser.add_argument(flag, help=text)
    parser.add_argument(
        "--imex-port", type=int, help="the IMEX peer port (default 50000; env DRA_IMEX_PORT)"
    )


def _demo(settings: Settings, ns: argparse.Namespace) -> int:
    # The demo lives in the development environment and needs the checkout around it (the
    # control plane's Go module, the examples); a wheel may carry devenv/ without them.
    try:
        from devenv.demo import run_demo
        from devenv.localcluster import repo_root
    except ModuleNotFoundError as exc:
        if exc.name not in ("devenv", "devenv.demo", "devenv.localcluster"):
            raise
        checkout = False
    else:
        checkout = (repo_root() / "testenv" / "go.mod").is_file()
    if not checkout:
        print(
            "dra-driver demo needs a checkout of the project set up with `make install`",
            file=sys.stderr,
        )
        return exitcodes.ERROR
    return run_demo(keep=ns.keep)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep", action="store_true", help="leave the control plane's files for inspection"
    )


def _inject_health(settings: Settings, ns: argparse.Namespace) -> int:
    from dra_driver.gpu.health.injected import INJECT_FILE, inject

    path = settings.plugins_dir / settings.driver_name / INJECT_FILE
    if not path.parent.is_dir():
        raise SettingsError(
            f"{path.parent} does not exist: is the agent running with this --plugins-dir?"
        )
    condition = None if ns.clear else ({"lost": True} if ns.lost else {"xid": ns.xid})
    inject(path, ns.device, condition)
    print(f"{ns.device}: {'cleared' if condition is None else condition} ({path})")
    return 0


def _inject_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("device", help="device name (gpu-0, a MIG device name) or UUID")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--xid", type=int, help="report this Xid error")
    what.add_argument("--lost", action="store_true", help="report the GPU as lost")
    what.add_argument(
        "--clear",
        action="store_true",
        help="the device is fine again (the agent's next re-check untaints it)",
    )


def _hw_check(settings: Settings, ns: argparse.Namespace) -> int:
    from dra_driver.gpu.hwcheck import render_table, report_json
    from dra_driver.gpu.hwcheck_probe import host_sharing, run_checks

    report = run_checks(
        settings.driver_root,
        carve=ns.carve,
        mps=ns.mps,
        sharing=host_sharing(settings.host_driver_root),
    )
    if settings.output == "table":
        print("\n".join(render_table(report)))
    else:
        print_objects(report_json(report), settings.output)
    return exitcodes.ERROR if report.failed else exitcodes.OK


def _hw_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--carve",
        action="store_true",
        help="create and destroy one MIG device of the smallest profile on the first GPU "
        "in MIG mode with room (changes the GPU while it runs)",
    )
    parser.add_argument(
        "--mps",
        action="store_true",
        help="start one MPS control daemon on the first GPU and stop it",
    )


COMMANDS: dict[str, Command] = {
    "discover": Command(
        "print the node's GPU inventory", (*_DISCOVERY, "output", *_LOGGING), _discover
    ),
    "slices": Command(
        "print the ResourceSlices the driver would publish for this node",
        (
            *_DISCOVERY,
            "compat",
            "driver_name",
            "dynamic_mig",
            "mig_layout",
            "mig_profiles",
            "shared_gpus",
            "list_attributes",
            "output",
            *_LOGGING,
        ),
        _slices,
        defaults={"output": "yaml"},
    ),
    "run": Command(
        "run the node agent: serve the kubelet and publish ResourceSlices", RUN_FIELDS, _run
    ),
    "cleanup": Command(
        "delete one node's ResourceSlices of this driver (after an uninstall)",
        ("node_name", "compat", "driver_name", "kubeconfig", "context", *_LOGGING),
        _cleanup,
    ),
    "compute-domain-plugin": Command(
        "serve the node's IMEX channel and daemon devices (ComputeDomains) to the kubelet",
        (
            *_DISCOVERY,
            "compat",
            "kubeconfig",
            "context",
            "cdi_root",
            "plugins_dir",
            "registry_dir",
            "pod_uid",
            "driver_root",
            "imex_binding_conditions",
            *_LOGGING,
        ),
        _compute_domain_plugin,
    ),
    "compute-domain-controller": Command(
        "run the ComputeDomain controller: IMEX daemons, channel templates, domain status",
        (
            "compat",
            "kubeconfig",
            "context",
            "namespace",
            "imex_image",
            "imex_pull_policy",
            "imex_pull_secrets",
            "host_driver_root",
            *_LOGGING,
        ),
        _compute_domain_controller,
    ),
    "imex-daemon": Command(
        "run a compute domain's IMEX daemon on this node (in the pods of the domain's "
        "DaemonSet), or --check whether it is ready",
        ("compat", "kubeconfig", "driver_root", "node_name", *_LOGGING),
        _imex_daemon,
        arguments=_imex_daemon_arguments,
    ),
    "match": MATCH,
    "explain-claim": EXPLAIN_CLAIM,
    "inject-health": Command(
        "simulated nodes: make a device report an Xid error, get lost, or recover",
        ("plugins_dir", "driver_name", *_LOGGING),
        _inject_health,
        arguments=_inject_arguments,
    ),
    "hw-check": Command(
        "pre-flight checks of this node's NVIDIA driver and GPUs: one line per check, "
        "exit status 1 when one fails",
        ("driver_root", "host_driver_root", "output", *_LOGGING),
        _hw_check,
        defaults={"log_level": "warning"},
        arguments=_hw_check_arguments,
    ),
    "demo": Command(
        "local control plane + two simulated GPU nodes + the driver + example pods",
        _LOGGING,
        _demo,
        defaults={"log_level": "warning"},
        arguments=_demo_arguments,
    ),
}


class _VersionAction(argparse.Action):
    """``--version``: the installed package's version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"dra-driver {package_version()}")
        parser.exit()


def build_parser() -> tuple[Parser, dict[str, Parser]]:
    """The argument parser, and the sub-parser of each command."""
    parser = Parser(
        prog="dra-driver",
        description="Kubernetes DRA driver for NVIDIA GPUs. "
        "Every flag can also be set as an environment variable DRA_<FLAG_NAME>.",
        epilog=exitcodes.DESCRIPTION,
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )
    commands: dict[str, Parser] = {}
    for name, command in COMMANDS.items():
        command_parser = sub.add_parser(
            name, help=command.help, description=command.help, epilog=exitcodes.DESCRIPTION
        )
        add_arguments(command_parser, command.fields, **command.defaults)
        if command.arguments is not None:
            command.arguments(command_parser)
        commands[name] = command_parser
    return parser, commands


@dataclass(frozen=True)
class Parsed:
    """A command line, understood: the command, its settings and its other arguments."""

    name: str
    command: Command
    settings: Settings
    namespace: argparse.Namespace


def parse(argv: Sequence[str]) -> Parsed:
    """Parse and check a command line (flags, then DRA_* variables, then defaults).

    Usage errors exit with status 2 after printing the usage; a bad value raises
    :class:`SettingsError`.
    """
    parser, commands = build_parser()
    ns, extra = parser.parse_known_args(argv)
    if extra:
        # Reported by the subcommand's parser: its usage, and a suggestion from its flags.
        commands[ns.command].error(f"unrecognized arguments: {' '.join(extra)}")
    command = COMMANDS[ns.command]
    apply_environment(commands[ns.command], ns)
    return Parsed(ns.command, command, from_namespace(ns, command.fields), ns)
