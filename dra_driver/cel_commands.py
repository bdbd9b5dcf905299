"""The ``match`` and ``explain-claim`` subcommands.

``dra-driver match`` evaluates the selectors of a DeviceClass and/or a claim (file, or name in a
cluster) against devices of a simulated profile, a ResourceSlice file or the cluster, and prints
per device: match, no match (with the false part and the values it read) or error.
Exit status (:mod:`dra_driver.exitcodes`): 0 when at least one device matched, 4 when none did,
3 when the named claim or class does not exist, 1 when the input could not be read (bad file,
API error), 2 for missing flags.

``dra-driver explain-claim [-n NAMESPACE] NAME`` (or ``NAMESPACE/NAME``) explains, per request
of a claim in the cluster, how many devices each selector leaves per pool, which are allocated
to other claims, and which count or constraint blocks. Exit status: 0 when nothing blocks (or
the claim is allocated), 4 when something blocks, 3 when the claim does not exist, 1 when the
input could not be read.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from dra_driver import exitcodes, resourceapi
from dra_driver.command import Command
from dra_driver.errors import DriverError
from dra_driver.output import print_objects
from dra_driver.settings import Settings

#: File names that are meant as files, never as a name in the cluster.
_FILE_SUFFIXES = (".yaml", ".yml", ".json")


class InputError(DriverError):
    """Unreadable files or API errors: reported on stderr with the exit status it carries."""

    def __init__(self, message: str, status: int = exitcodes.ERROR) -> None:
        super().__init__(message)
        self.status = status


def _match_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--class",
        dest="device_class",
        metavar="FILE|NAME",
        help="DeviceClass: a YAML/JSON file, or a name looked up in the cluster",
    )
    parser.add_argument(
        "--claim",
        metavar="FILE|NAMESPACE/NAME",
        help="ResourceClaim or ResourceClaimTemplate: a file, or a claim (then a "
        "template) looked up in the cluster",
    )
    parser.add_argument(
        "--slices",
        metavar="FILE",
        help="ResourceSlices (multi-document YAML, JSON or a List) to match against",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="match against the cluster's ResourceSlices (uses --kubeconfig)",
    )


def _is_file(value: str | None) -> bool:
    """Whether ``value`` names a file; one that looks like a path must exist."""
    if not value:
        return False
    if Path(value).is_file():
        return True
    if value.endswith(_FILE_SUFFIXES) or value.startswith((".", os.sep, "~")):
        raise InputError(f"{value}: no such file")
    return False


def _claim_key(settings: Settings, value: str, context_namespace: str) -> str:
    """``NAMESPACE/NAME`` as given, else ``NAME`` in ``--namespace`` (-n), else in the
    kubeconfig context's namespace (in a pod: the service account's), else in default."""
    if "/" in value:
        return value
    namespace = settings.namespace or context_namespace or "default"
    return f"{namespace}/{value}"


def _live_error(exc: Exception) -> InputError:
    """An API error as an input error; 404 gets its own exit status."""
    status = exitcodes.NOT_FOUND if getattr(exc, "status", 0) == 404 else exitcodes.ERROR
    return InputError(str(exc), status)


async def _cluster_inputs(settings: Settings, ns: argparse.Namespace) -> dict[str, Any]:
    from dra_driver.cel import live
    from dra_driver.cel.match import slice_devices
    from dra_driver.kube import KubeClient

    client = await KubeClient.create(settings.kubeconfig, context=settings.context)
    try:
        out: dict[str, Any] = {}
        if ns.device_class and not _is_file(ns.device_class):
            out["class"] = await live.get_class(client, ns.device_class)
        if ns.claim and not _is_file(ns.claim):
            key = _claim_key(settings, ns.claim, client.connection.namespace)
            out["claims"] = [await live.get_claim(client, key)]
        out["classes"] = await live.list_all(
            client, resourceapi.path(resourceapi.DEVICE_CLASSES), "DeviceClass"
        )
        if ns.live and not ns.slices and not settings.profile:
            slices = await live.list_all(
                client, resourceapi.path(resourceapi.RESOURCE_SLICES), "ResourceSlice"
            )
            out["devices"] = slice_devices(slices)
        return out
    except live.LiveError as exc:
        raise _live_error(exc) from None
    finally:
        await client.close()


def _match_inputs(settings: Settings, ns: argparse.Namespace) -> dict[str, Any]:
    from dra_driver.cel import sources

    needs_cluster = ns.live or any(
        value and not _is_file(value) for value in (ns.device_class, ns.claim)
    )
    inputs: dict[str, Any] = asyncio.run(_cluster_inputs(settings, ns)) if needs_cluster else {}
    try:
        if _is_file(ns.device_class):
            file_classes = sources.load_all(ns.device_class, ("DeviceClass",))
            inputs["class"] = file_classes[0]
            # A file may hold several (manifests/base/deviceclasses.yaml): each request of the
            # claim looks its own up among them, as the scheduler looks it up in the cluster.
            inputs["classes"] = [*inputs.get("classes", []), *file_classes]
        if _is_file(ns.claim):
            # Every claim of the file (an example may hold several), each judged on its own.
            inputs["claims"] = sources.load_all(
                ns.claim, ("ResourceClaim", "ResourceClaimTemplate")
            )
        if ns.slices:
            try:
                inputs["devices"] = sources.slice_file_devices(ns.slices)
            except _MALFORMED as exc:
                raise InputError(f"{ns.slices}: malformed ResourceSlice: {exc}") from None
        elif settings.profile:
            inputs["devices"] = sources.profile_devices(
                settings.profile, settings.node_name or "node", settings.driver_name
            )
    except sources.SourceError as exc:
        raise InputError(str(exc)) from None
    return inputs


#: What reading a hand-written object of the wrong shape raises (a list where a map belongs...).
_MALFORMED = (AttributeError, TypeError, ValueError, KeyError)


def _run_match(settings: Settings, ns: argparse.Namespace) -> int:
    from dra_driver.cel.match import match_devices, prepare, selector_sets
    from dra_driver.cel.render import match_text

    if not ns.device_class and not ns.claim:
        return _fail("match", "give --class and/or --claim", exitcodes.USAGE)
    if not (ns.slices or settings.profile or ns.live):
        return _fail(
            "match", "no devices: give --slices FILE, --profile NAME or --live", exitcodes.USAGE
        )
    try:
        inputs = _match_inputs(settings, ns)
    except InputError as exc:
        return _fail("match", str(exc), exc.status)
    classes = {(c.get("metadata") or {}).get("name", ""): c for c in inputs.get("classes", [])}
    claims: list[Any] = inputs.get("claims") or [None]
    sets = []
    try:
        for claim in claims:
            claim_sets = selector_sets(inputs.get("class"), claim, classes)
            if len(claims) > 1:
                name = (claim.get("metadata") or {}).get("name", "?")
                claim_sets = [
                    replace(s, label=f"{claim['kind']} {name}: {s.label}") for s in claim_sets
                ]
            sets += claim_sets
    except _MALFORMED as exc:
        return _fail("match", f"malformed DeviceClass or claim: {exc}", exitcodes.ERROR)
    if not sets:
        return _fail("match", "the claim has no requests", exitcodes.ERROR)
    devices = inputs["devices"]
    prepared = prepare(devices)  # convert each device once for all selector sets
    results = [(s, match_devices(devices, s.selectors, prepared=prepared)) for s in sets]
    matched = any(r.verdict.value == "match" for _, devices in results for r in devices)
    if settings.output == "table":
        print(match_text(results))
    else:
        print_objects(
            {
                "matched": matched,
                "sets": [
                    {
                        "label": s.label,
                        "selectors": [
                            {"origin": x.origin, "expression": x.expression} for x in s.selectors
                        ],
                        "devices": [d.to_json() for d in devices],
                    }
                    for s, devices in results
                ],
            },
            settings.output,
        )
    return exitcodes.OK if matched else exitcodes.NO_MATCH


def _fail(command: str, message: str, status: int) -> int:
    print(f"dra-driver {command}: error: {message}", file=sys.stderr)
    return status


def _explain_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "claim",
        metavar="NAME",
        help="the ResourceClaim: NAME in --namespace, or NAMESPACE/NAME",
    )


async def _explain_inputs(settings: Settings, key: str) -> tuple[Any, Any]:
    from dra_driver.cel import live
    from dra_driver.kube import KubeClient

    client = await KubeClient.create(settings.kubeconfig, context=settings.context)
    try:
        claim = await live.get_claim(client, _claim_key(settings, key, client.connection.namespace))
        return claim, await live.cluster_state(client)
    except live.LiveError as exc:
        raise _live_error(exc) from None
    finally:
        await client.close()


def _run_explain(settings: Settings, ns: argparse.Namespace) -> int:
    from dra_driver.cel.claim_explain import explain_claim
    from dra_driver.cel.render import claim_text

    try:
        claim, state = asyncio.run(_explain_inputs(settings, ns.claim))
    except InputError as exc:
        return _fail("explain-claim", str(exc), exc.status)
    report = explain_claim(claim, state.classes, state.slices, state.claims)
    if settings.output == "table":
        print(claim_text(report))
    else:
        print_objects(report.to_json(), settings.output)
    return exitcodes.OK if report.allocated or not report.blocking else exitcodes.NO_MATCH


_LOGGING = ("log_format", "log_level")

MATCH = Command(
    help="show which devices the selectors of a DeviceClass and/or claim match, and why not",
    fields=(
        "driver_name",
        "profile",
        "node_name",
        "kubeconfig",
        "context",
        "namespace",
        "output",
        *_LOGGING,
    ),
    run=_run_match,
    arguments=_match_arguments,
)

EXPLAIN_CLAIM = Command(
    help="explain per request why a ResourceClaim does (not) allocate",
    fields=("kubeconfig", "context", "namespace", "output", *_LOGGING),
    run=_run_explain,
    arguments=_explain_arguments,
)
