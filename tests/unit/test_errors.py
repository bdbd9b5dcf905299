"""Every exception class of the project derives from one base."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import dra_driver
from dra_driver.errors import DriverError, PrepareError


def _exception_classes(prefix: str) -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(dra_driver.__path__, "dra_driver."):
        if info.name.startswith("dra_driver._proto") or not info.name.startswith(prefix):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == info.name
            ):
                found[f"{info.name}.{name}"] = obj
    return found


def _outside_gpu() -> dict[str, type[BaseException]]:
    return {
        k: v
        for k, v in _exception_classes("dra_driver").items()
        if not k.startswith("dra_driver.gpu.")
    }


def test_exceptions_outside_gpu_derive_from_driver_error() -> None:
    classes = _outside_gpu()
    assert "dra_driver.kubeletplugin.claims.PrepareError" not in classes  # imported, not defined
    assert len(classes) >= 10
    assert [k for k, v in classes.items() if not issubclass(v, DriverError)] == []


def test_gpu_exceptions_derive_from_driver_error() -> None:
    classes = _exception_classes("dra_driver.gpu")
    assert [k for k, v in classes.items() if not issubclass(v, DriverError)] == []


def test_refused_claims_share_one_user_facing_base() -> None:
    from dra_driver.gpu.state.planner import ClaimError
    from dra_driver.kubeletplugin import PrepareError as ServicerPrepareError

    assert ServicerPrepareError is PrepareError
    assert issubclass(ClaimError, PrepareError)
