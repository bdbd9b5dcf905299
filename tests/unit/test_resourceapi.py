"""REST paths of the resource.k8s.io group, built in one place."""

from __future__ import annotations

import pytest

from dra_driver import resourceapi


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        (("resourceslices",), {}, "/apis/resource.k8s.io/v1/resourceslices"),
        (("deviceclasses", "gpu.dra.dev"), {}, "/apis/resource.k8s.io/v1/deviceclasses/gpu.dra.dev"),
        (
            ("resourceclaims",),
            {"namespace": "team-a"},
            "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims",
        ),
        (
            ("resourceclaims", "c/1"),
            {"namespace": "a b", "subresource": "status"},
            "/apis/resource.k8s.io/v1/namespaces/a%20b/resourceclaims/c%2F1/status",
        ),
    ],
)
def test_path(args: tuple[str, ...], kwargs: dict[str, str], expected: str) -> None:
    assert resourceapi.path(*args, **kwargs) == expected


def test_api_version_matches_base_path() -> None:
    assert resourceapi.BASE_PATH == "/apis/" + resourceapi.API_VERSION == "/apis/resource.k8s.io/v1"
