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
