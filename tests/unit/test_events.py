"""Kubernetes Events: names the API server accepts."""

from __future__ import annotations

import re

import pytest

from dra_driver.events import event_name

DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"


@pytest.mark.parametrize(
    "name", ["c", "a" * 253, "a" * 239 + ".b" * 7, "x" * 239 + "-y" + "z" * 12, "n1.example.com"]
)
def test_an_event_name_is_a_dns_subdomain_for_any_object_name(name: str) -> None:
    # The API server refuses an Event whose name is not a DNS subdomain: a claim or domain
    # with a long name (up to 253 characters) got none of its Events.
    made = {event_name(name) for _ in range(3)}
    assert len(made) == 3
    for event in made:
        assert len(event) <= 253
        assert re.fullmatch(DNS_SUBDOMAIN, event)
        assert event.startswith(name[:200])


async def test_a_node_event_shows_in_kubectl_describe_node() -> None:
    # `kubectl describe node` lists the Events whose involvedObject.uid is the node's name
    # (the kubelet's convention) or its UID; one without a uid matched neither, so the Node
    # Events the agent posts (GPULost, DevicesKept, ...) were never shown there.
    import json

    from dra_driver.events import post_event
    from tests.unit.kubeserver import plain_client, serve

    async with serve() as server, plain_client(server) as client:
        server.json("POST", "/api/v1/namespaces/default/events", 201, {})
        server.json("POST", "/api/v1/namespaces/ns/events", 201, {})
        assert await post_event(client, kind="Node", name="n1", reason="GPULost", message="m")
        assert await post_event(
            client,
            kind="ResourceClaim",
            name="c",
            namespace="ns",
            uid="u1",
            reason="R",
            message="m",
        )
    node, claim = (json.loads(s["body"])["involvedObject"] for s in server.seen)
    assert node == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"}
    assert claim["uid"] == "u1"
