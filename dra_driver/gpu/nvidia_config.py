"""The NVIDIA DRA driver's opaque configuration API, ``resource.nvidia.com/v1beta1``, accepted
with ``--compat nvidia`` beside this driver's own ``gpu.dra.dev/v1alpha1``.

The kinds (``GpuConfig``, ``MigDeviceConfig``) and their field names are the same as ours, so
the models extend ours; where the NVIDIA driver reads a field differently, these models follow
it (docs/migrating.md lists each difference):

- ``mpsConfig.defaultActiveThreadPercentage`` may be 0 (ours: 1 to 100);
- pinned-memory limits have no upper bound (ours: 1Mi to 4Ti); both refuse less than 1Mi;
- a pinned-memory limit may be a JSON number of bytes, as a ``resource.Quantity`` may be
  (ours: a quantity string), and ``defaultPerDevicePinnedMemoryLimit`` may be null;
- ``mpsConfig.multiUser`` starts the MPS control daemon in multi-user mode (``-M``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from dra_driver.gpu.config import (
    MEMORY_LIMIT,
    MIN_LIMIT,
    OWN_API,
    QUANTITY_KEY,
    ConfigKinds,
    GpuConfig,
    GpuSharing,
    MigDeviceConfig,
    MigSharing,
    MpsConfig,
)

API_GROUP_VERSION = "resource.nvidia.com/v1beta1"


#: The NVIDIA driver's pinned-memory limits: at least 1Mi (it hands MPS whole MiB), no upper
#: bound but the int64 a ``resource.Quantity`` holds, and a JSON number of bytes as well as a
#: string (a ``resource.Quantity`` decodes either).
NVIDIA_MEMORY_LIMIT: dict[str, Any] = {
    **MEMORY_LIMIT,
    "minimum": MIN_LIMIT,
    "maximum": 2**63 - 1,
    "range": "1Mi and more",
    "numbers": True,
}


def _number_as_quantity(value: Any) -> Any:
    """A JSON number of bytes as the quantity string it stands for; anything else as it is
    (the field's own validation then says what is wrong with it)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    return value


class NvidiaMpsConfig(MpsConfig):
    """``mpsConfig`` as the NVIDIA driver reads it."""

    default_active_thread_percentage: Annotated[int, Field(ge=0, le=100)] | None = Field(
        default=None, alias="defaultActiveThreadPercentage"
    )
    default_pinned_device_memory_limit: str | None = Field(
        default=None,
        alias="defaultPinnedDeviceMemoryLimit",
        json_schema_extra={QUANTITY_KEY: NVIDIA_MEMORY_LIMIT},
    )
    # null is no limits, as Go decodes null into a map (read as {} before validation).
    default_per_device_pinned_memory_limit: dict[str, str] | None = Field(  # type: ignore[assignment]
        default_factory=dict,
        alias="defaultPerDevicePinnedMemoryLimit",
        json_schema_extra={QUANTITY_KEY: NVIDIA_MEMORY_LIMIT},
    )
    multi_user: bool | None = Field(default=None, alias="multiUser")
    limit_bounds = NVIDIA_MEMORY_LIMIT

    @field_validator("default_pinned_device_memory_limit", mode="before")
    @classmethod
    def _number_limit(cls, value: Any) -> Any:
        return _number_as_quantity(value)

    @field_validator("default_per_device_pinned_memory_limit", mode="before")
    @classmethod
    def _number_limits(cls, value: Any) -> Any:
        if value is None:
            return {}
        if isinstance(value, dict):
            return {key: _number_as_quantity(limit) for key, limit in value.items()}
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
