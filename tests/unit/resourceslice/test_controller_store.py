"""The controller's view of stored slices: stale watch events never overwrite newer writes."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.resourceslice.controller import SliceController
from dra_driver.resourceslice.pool import DesiredPool
from dra_driver.resourceslice.reporting import ApiErrorReporter
from dra_driver.resourceslice.store import SliceStore, field_selector, is_older

JSON = dict[str, Any]


def obj(name: str, rv: str, uid: str = "u1", node: str = "n", driver: str = "d") -> JSON:
    return {
        "metadata": {"name": name, "resourceVersion": rv, "uid": uid},
        "spec": {"driver": driver, "nodeName": node},
    }


@pytest.fixture
def controller() -> SliceController:
    return SliceController(None, driver="d", node_name="n")


@pytest.fixture
def store() -> SliceStore:
    return SliceStore("d", "n")


def names(store: SliceStore) -> list[str]:
    return list(store.objects)


def test_field_selector() -> None:
    assert field_selector("node-1", "gpu.dra.dev") == "spec.nodeName=node-1,spec.driver=gpu.dra.dev"


@pytest.mark.parametrize(
    ("candidate", "current", "older"),
    [("5", "7", True), ("7", "7", False), ("9", "7", False), ("abc", "7", False), ("", "7", False)],
)
def test_is_older(candidate: str, current: str, older: bool) -> None:
    assert is_older(candidate, current) is older


def test_stale_event_does_not_replace_a_newer_write(store: SliceStore) -> None:
    store.remember(obj("s", "10"))
    store.remember(obj("s", "8"))
    assert store.objects["s"]["metadata"]["resourceVersion"] == "10"
    store.remember(obj("s", "12"))
    assert store.objects["s"]["metadata"]["resourceVersion"] == "12"


def test_late_delete_of_an_older_incarnation_is_ignored(store: SliceStore) -> None:
    store.remember(obj("s", "20", uid="new"))
    store.forget(obj("s", "15", uid="old"))
    assert [o["metadata"]["uid"] for o in store.objects.values()] == ["new"]
    store.forget(obj("s", "21", uid="new"))
    assert store.objects == {}


def test_a_write_answered_after_the_watch_showed_it_deleted_is_not_stored(
    store: SliceStore,
) -> None:
    # The create is answered with rv 98; before the answer is handled, the watch hands over
    # its ADDED event and the DELETED event of someone else's delete (rv 99).
    store.remember(obj("s", "98"))
    store.forget(obj("s", "99"))
    store.remember_written(obj("s", "98"), seen="99")
    assert names(store) == []


def test_a_write_answered_after_a_listing_without_it_is_not_stored(store: SliceStore) -> None:
    store.replace([obj("other", "90", uid="u2")])
    store.remember_written(obj("s", "98"), seen="100")
    assert names(store) == ["other"]


def test_a_write_answered_after_a_recreation_keeps_the_recreated_slice(
    store: SliceStore,
) -> None:
    store.remember(obj("s", "101", uid="theirs"))
    store.remember_written(obj("s", "98", uid="ours"), seen="101")
    assert [o["metadata"]["uid"] for o in store.objects.values()] == ["theirs"]


@pytest.mark.parametrize(
    ("held", "seen", "stored"),
    [
        (None, "97", "98"),  # the watch has not reached the write yet: store it
        (None, "", "98"),  # nothing listed yet
        (None, "abc", "98"),  # versions that are not integers tell nothing
        ("95", "98", "98"),  # the watch already showed this very version
        ("95", "97", "98"),  # an update answered before its event
        ("99", "99", "99"),  # a newer version already held stays
    ],
)
def test_a_write_answer_is_stored_unless_the_view_moved_past_it(
    store: SliceStore, held: str | None, seen: str, stored: str
) -> None:
    if held is not None:
        store.remember(obj("s", held))
    store.remember_written(obj("s", "98"), seen=seen)
    assert store.objects["s"]["metadata"]["resourceVersion"] == stored


def test_foreign_slices_are_not_stored(store: SliceStore) -> None:
    store.remember(obj("a", "1", node="other"))
    store.remember(obj("b", "1", driver="other"))
    assert names(store) == []
    store.replace([obj("c", "1"), obj("d", "1", node="other")])
    assert names(store) == ["c"]


async def test_set_pool_rejects_a_pool_of_another_node(controller: SliceController) -> None:
    with pytest.raises(ValueError, match="controller for d on n"):
        await controller.set_pool(DesiredPool("d", "x", "x"))
    await controller.set_pool(DesiredPool("d", "n", "n"))
    assert not controller.synced


def test_forbidden_is_logged_once_naming_verb_and_resource() -> None:
    import structlog
    from structlog.testing import capture_logs

    from dra_driver.resourceslice.rawapi import ApiError

    reporter = ApiErrorReporter(structlog.get_logger("test"))
    err = ApiError(403, "Forbidden", "nope", verb="list", resource="resourceslices")
    with capture_logs() as logs:
        reporter.report(err)
        reporter.report(err)
    errors = [entry for entry in logs if entry["log_level"] == "error"]
    assert len(errors) == 1
    assert "may not list resourceslices" in errors[0]["event"]


def test_invalid_slice_is_logged_with_its_name() -> None:
    import structlog
    from structlog.testing import capture_logs

    from dra_driver.resourceslice.rawapi import ApiError

    err = ApiError(
        422,
        "Invalid",
        "spec.devices[0].name: Invalid value",
        verb="create",
        resource="resourceslices",
        name="n-d-0",
    )
    with capture_logs() as logs:
        ApiErrorReporter(structlog.get_logger("test")).report(err)
    assert logs[0]["slice"] == "n-d-0"
    assert "Invalid value" in logs[0]["message"]


def test_a_taken_slice_name_is_an_error_once_per_episode() -> None:
    """Reported loudly once while the name stays taken (each retry at debug level), and
    loudly again when it is taken again after the pool was published in between."""
    import structlog
    from structlog.testing import capture_logs

    reporter = ApiErrorReporter(structlog.get_logger("test"))
    with capture_logs() as logs:
        reporter.name_taken("n-d-0")
        reporter.name_taken("n-d-0")
        reporter.published()
        reporter.name_taken("n-d-0")
    # The retry's line is at debug level (which the session's log level may filter out).
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 2
    assert "kubectl delete resourceslice n-d-0" in errors[0]["event"]
