"""The NVIDIA DRA driver's opaque configuration API, ``resource.nvidia.com/v1beta1``, accepted
with ``--compat nvidia`` beside this driver's own ``gpu.dra.dev/v1alpha1``.

The kinds (``GpuConfig``, ``MigDeviceConfig``) and their field names are the same as ours, so
the models extend ours; where the NVIDIA driver reads a field differently, these models follow
it (docs/migrating.md lists each difference):

- ``mpsConfig.defaultActiveThreadPercentage`` may be 0 (ours: 1 to 100);
- pinned-memory limits may be numbers of bytes as well as quantity strings, and have no upper
  bound (ours: quantity strings from 1Mi to 4Ti); both refuse less than 1Mi;
- ``mpsConfig.multiUser`` starts the MPS control daemon in multi-user mode (``-M``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from dra_driver.gpu.config import (
    MIN_LIMIT,
    OWN_API,
    ConfigKinds,
    GpuConfig,
    GpuSharing,
    MigDeviceConfig,
    MigSharing,
    MpsConfig,
    memory_bytes,
    quote,
)

API_GROUP_VERSION = "resource.nvidia.com/v1beta1"


def _nvidia_limit(value: object) -> str:
    """A pinned-memory limit as the NVIDIA driver reads a ``resource.Quantity``: a quantity
    string or a number of bytes, at least 1Mi (it hands MPS whole MiB)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{quote(value)} is not a memory quantity such as 10Gi or 512Mi")
    text = str(value)
    if memory_bytes(text) < MIN_LIMIT:
        raise ValueError(f"{quote(value)} is below 1Mi, the smallest limit MPS takes")
    return text


class NvidiaMpsConfig(MpsConfig):
    """``mpsConfig`` as the NVIDIA driver reads it."""

    default_active_thread_percentage: Annotated[int, Field(ge=0, le=100)] | None = Field(
        default=None, alias="defaultActiveThreadPercentage"
    )
    multi_user: bool | None = Field(default=None, alias="multiUser")

    @field_validator(
        "default_pinned_device_memory_limit",
        "default_per_device_pinned_memory_limit",
        mode="before",
    )
    @classmethod
    def _limits_as_nvidia_reads_them(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, Mapping):
            for key in value:
                if not key:
                    raise ValueError("a device key must be a device index or UUID, not empty")
            return {str(k): _nvidia_limit(v) for k, v in value.items()}
        return _nvidia_limit(value)

    # The NVIDIA driver sets no upper bound: these replace the checks of ours by name.
    @field_validator("default_pinned_device_memory_limit")
    @classmethod
    def _check_limit(cls, value: str | None) -> str | None:
        return value

    @field_validator("default_per_device_pinned_memory_limit")
    @classmethod
    def _check_limits(cls, value: dict[str, str]) -> dict[str, str]:
        return value


class NvidiaGpuSharing(GpuSharing):
    """``sharing`` of a ``GpuConfig``."""

    mps_config: NvidiaMpsConfig | None = Field(default=None, alias="mpsConfig")


class NvidiaMigSharing(MigSharing):
    """``sharing`` of a ``MigDeviceConfig``."""

    mps_config: NvidiaMpsConfig | None = Field(default=None, alias="mpsConfig")


class NvidiaGpuConfig(GpuConfig):
    """``kind: GpuConfig`` of ``resource.nvidia.com/v1beta1``."""

    api_version: Literal["resource.nvidia.com/v1beta1"] = Field(alias="apiVersion")  # type: ignore[assignment]
    sharing: NvidiaGpuSharing | None = None


class NvidiaMigDeviceConfig(MigDeviceConfig):
    """``kind: MigDeviceConfig`` of ``resource.nvidia.com/v1beta1``."""

    api_version: Literal["resource.nvidia.com/v1beta1"] = Field(alias="apiVersion")  # type: ignore[assignment]
    sharing: NvidiaMigSharing | None = None


NVIDIA_API: ConfigKinds = {
    API_GROUP_VERSION: {"GpuConfig": NvidiaGpuConfig, "MigDeviceConfig": NvidiaMigDeviceConfig}
}


def config_apis(compat: str) -> ConfigKinds:
    """The opaque config APIs the driver accepts in a compatibility mode ("" or "nvidia")."""
    return {**OWN_API, **NVIDIA_API} if compat == "nvidia" else OWN_API
