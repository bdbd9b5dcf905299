"""The opaque config API: strict parsing, and which config applies to which device."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.gpu.config import (
    ConfigError,
    GpuConfig,
    MigDeviceConfig,
    check_device_keys,
    memory_bytes,
    parse_allocation_config,
    parse_config,
    resolve_config,
)

DRIVER = "gpu.dra.dev"


def _entry(params: dict[str, Any], source: str = "FromClaim", requests: list[str] | None = None, driver: str = DRIVER) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def _gpu(strategy: str = "TimeSlicing", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "gpu.dra.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": strategy, **extra}}


def test_time_slicing() -> None:
    config = parse_config(_gpu(timeSlicingConfig={"interval": "Long"}), where="c")
    assert isinstance(config, GpuConfig) and config.sharing is not None
    assert config.sharing.time_slicing_config is not None and config.sharing.time_slicing_config.interval == "Long"


def test_mps() -> None:
    config = parse_config(
        _gpu("MPS", mpsConfig={"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi", "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"}}),
        where="c",
    )
    assert config.sharing is not None and config.sharing.mps_config is not None
    assert config.sharing.mps_config.default_active_thread_percentage == 50


def test_mig_config() -> None:
    config = parse_config({"apiVersion": "gpu.dra.dev/v1alpha1", "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}, where="c")
    assert isinstance(config, MigDeviceConfig)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("not an object", "must be an object"),
        ({"apiVersion": "gpu.dra.dev/v1", "kind": "GpuConfig"}, "apiVersion 'gpu.dra.dev/v1' is not 'gpu.dra.dev/v1alpha1'"),
        ({"apiVersion": "gpu.dra.dev/v1alpha1", "kind": "TpuConfig"}, "kind 'TpuConfig' is not one of GpuConfig, MigDeviceConfig"),
        ({**_gpu(), "sharng": {}}, "field 'sharng': unknown field"),
        (_gpu(timeSlicingConfig={"intervall": "Long"}), "field 'sharing.timeSlicingConfig.intervall': unknown field"),
        (_gpu(timeSlicingConfig={"interval": "Forever"}), "field 'sharing.timeSlicingConfig.interval'"),
        (_gpu("Exclusive"), "field 'sharing.strategy'"),
        (_gpu("MPS", mpsConfig={"defaultActiveThreadPercentage": 0}), "defaultActiveThreadPercentage"),
        (_gpu("MPS", mpsConfig={"defaultActiveThreadPercentage": 101}), "defaultActiveThreadPercentage"),
        (_gpu("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "ten gigs"}), "not a memory quantity"),
        # 1.5Gi is a quantity (1536Mi), as in a Kubernetes resource.Quantity field; 1.5GB is not.
        (_gpu("MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": {"0": "1.5GB"}}), "not a memory quantity"),
        ({"apiVersion": "gpu.dra.dev/v1alpha1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}}, "timeSlicingConfig': unknown field"),
    ],
)
def test_invalid_configs_name_claim_request_and_field(params: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_allocation_config([_entry(params, requests=["gpu"])], driver=DRIVER, claim="ns/my-claim")
    text = str(info.value)
    assert "claim ns/my-claim" in text and "config for gpu" in text and message in text, text


def test_other_drivers_are_ignored() -> None:
    assert parse_allocation_config([_entry({"whatever": 1}, driver="net.example.com")], driver=DRIVER, claim="c") == []


def test_claim_wins_over_class_and_later_over_earlier() -> None:
    entries = parse_allocation_config(
        [
            _entry(_gpu("MPS"), source="FromClaim", requests=["gpu"]),
            _entry(_gpu(timeSlicingConfig={"interval": "Short"}), source="FromClass"),
            _entry(_gpu(timeSlicingConfig={"interval": "Long"}), source="FromClaim", requests=["gpu"]),
        ],
        driver=DRIVER,
        claim="c",
    )
    chosen = resolve_config(entries, "gpu", "gpu", claim="c")
    assert chosen is not None and chosen.sharing is not None
    assert chosen.sharing.time_slicing_config is not None and chosen.sharing.time_slicing_config.interval == "Long"
    # Another request only sees the class config (it names no request).
    other = resolve_config(entries, "other", "gpu", claim="c")
    assert other is not None and other.sharing is not None and other.sharing.time_slicing_config is not None
    assert other.sharing.time_slicing_config.interval == "Short"


def test_subrequests_match_their_parent_and_themselves() -> None:
    entries = parse_allocation_config(
        [_entry(_gpu("MPS"), requests=["gpu"]), _entry(_gpu(), requests=["gpu/h100"])], driver=DRIVER, claim="c"
    )
    h100 = resolve_config(entries, "gpu/h100", "gpu", claim="c")
    a100 = resolve_config(entries, "gpu/a100", "gpu", claim="c")
    assert h100 is not None and h100.sharing is not None and h100.sharing.strategy == "TimeSlicing"
    assert a100 is not None and a100.sharing is not None and a100.sharing.strategy == "MPS"


def test_wrong_kind_named_for_request_is_an_error() -> None:
    entries = parse_allocation_config([_entry(_gpu(), requests=["mig"])], driver=DRIVER, claim="ns/c")
    with pytest.raises(ConfigError, match="GpuConfig cannot configure a mig device; use MigDeviceConfig"):
        resolve_config(entries, "mig", "mig", claim="ns/c")


def test_unnamed_config_of_other_kind_is_skipped() -> None:
    entries = parse_allocation_config([_entry(_gpu())], driver=DRIVER, claim="c")
    assert resolve_config(entries, "mig", "mig", claim="c") is None


def _mig(strategy: str = "TimeSlicing") -> dict[str, Any]:
    return {"apiVersion": "gpu.dra.dev/v1alpha1", "kind": "MigDeviceConfig", "sharing": {"strategy": strategy}}


def test_only_the_winning_config_can_be_of_the_wrong_kind() -> None:
    # As the NVIDIA driver: the configs are searched from the highest precedence (claim over
    # class, later over earlier) and the first one for the request decides; a config of the
    # wrong kind that a later or claim config overrides is no error.
    entries = parse_allocation_config(
        [
            _entry(_mig(), source="FromClass", requests=["gpu"]),
            _entry(_mig(), requests=["gpu"]),
            _entry(_gpu("MPS"), requests=["gpu"]),
        ],
        driver=DRIVER,
        claim="ns/c",
    )
    chosen = resolve_config(entries, "gpu", "gpu", claim="ns/c")
    assert chosen is not None and chosen.sharing is not None and chosen.sharing.strategy == "MPS"
    # A config for all requests overrides an earlier one of the wrong kind named for it.
    entries = parse_allocation_config(
        [_entry(_mig(), requests=["gpu"]), _entry(_gpu("MPS"))], driver=DRIVER, claim="ns/c"
    )
    chosen = resolve_config(entries, "gpu", "gpu", claim="ns/c")
    assert chosen is not None and chosen.kind == "GpuConfig"
    # The winner of the wrong kind is still an error.
    entries = parse_allocation_config(
        [_entry(_gpu("MPS"), requests=["gpu"]), _entry(_mig(), requests=["gpu"])], driver=DRIVER, claim="ns/c"
    )
    with pytest.raises(ConfigError, match="MigDeviceConfig cannot configure a gpu device; use GpuConfig"):
        resolve_config(entries, "gpu", "gpu", claim="ns/c")


def test_a_config_for_the_main_request_configures_subrequests_of_its_kind() -> None:
    # firstAvailable: a whole GPU or else a MIG device; one config of each kind for "gpu".
    entries = parse_allocation_config(
        [_entry(_gpu("MPS"), requests=["gpu"]), _entry(_mig(), requests=["gpu"])], driver=DRIVER, claim="ns/c"
    )
    mig = resolve_config(entries, "gpu/mig", "mig", claim="ns/c")
    whole = resolve_config(entries, "gpu/full", "gpu", claim="ns/c")
    assert mig is not None and mig.kind == "MigDeviceConfig"
    assert whole is not None and whole.kind == "GpuConfig"
    # Only a GpuConfig for "gpu": the MIG device it did not get has none.
    entries = parse_allocation_config([_entry(_gpu("MPS"), requests=["gpu"])], driver=DRIVER, claim="ns/c")
    assert resolve_config(entries, "gpu/mig", "mig", claim="ns/c") is None
    # Named for the subrequest itself, the wrong kind is an error.
    entries = parse_allocation_config([_entry(_gpu("MPS"), requests=["gpu/mig"])], driver=DRIVER, claim="ns/c")
    with pytest.raises(ConfigError, match="GpuConfig cannot configure a mig device"):
        resolve_config(entries, "gpu/mig", "mig", claim="ns/c")


@pytest.mark.parametrize(("text", "value"), [("10Gi", 10 * 2**30), ("512Mi", 512 * 2**20), ("1G", 10**9), ("1024", 1024)])
def test_memory_bytes(text: str, value: int) -> None:
    assert memory_bytes(text) == value


@pytest.mark.parametrize(
    ("params", "message"),
    [
        # One strategy's settings under the other are refused, not dropped.
        (_gpu("MPS", timeSlicingConfig={"interval": "Long"}), "timeSlicingConfig is set but the strategy is MPS"),
        (_gpu(mpsConfig={"defaultActiveThreadPercentage": 50}), "mpsConfig is set but the strategy is TimeSlicing"),
        (
            {"apiVersion": "gpu.dra.dev/v1alpha1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}},
            "mpsConfig is set but the strategy is TimeSlicing",
        ),
        # No coercion.
        (_gpu("MPS", mpsConfig={"defaultActiveThreadPercentage": True}), "defaultActiveThreadPercentage"),
        (_gpu("MPS", mpsConfig={"defaultActiveThreadPercentage": "50"}), "defaultActiveThreadPercentage"),
        (_gpu("MPS", mpsConfig={"defaultActiveThreadPercentage": 50.0}), "defaultActiveThreadPercentage"),
        # Limits: whole text, within bounds.
        (_gpu("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "0"}), "outside the allowed range"),
        (_gpu("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "1024"}), "outside the allowed range"),
        (_gpu("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "10Gi\n"}), "not a memory quantity"),
        (_gpu("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "1000Ti"}), "outside the allowed range"),
        # Kubernetes reads 4000 nines as a (huge) quantity: it is out of range, not malformed.
        (_gpu("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "9" * 4000}), "outside the allowed range"),
        (_gpu("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "9" * 5000}), "not a memory quantity"),
        (_gpu("MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": {"0": "0Mi"}}), "outside the allowed range"),
        (_gpu("MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": {"": "1Gi"}}), "not empty"),
        (_gpu("MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": {"0": 5}}), "defaultPerDevicePinnedMemoryLimit"),
    ],
)
def test_strict_config(params: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(params, where="claim ns/c")
    assert message in str(info.value), str(info.value)


def test_limits_at_the_bounds_are_accepted() -> None:
    for limit in ("1Mi", "4Ti", "1048576", "80Gi"):
        config = parse_config(_gpu("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": limit}), where="c")
        assert config.sharing is not None and config.sharing.mps_config is not None
        assert config.sharing.mps_config.default_pinned_device_memory_limit == limit


def test_huge_values_are_quoted_short() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_gpu("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "x" * 3_000_000}), where="c")
    assert len(str(info.value)) < 300
    with pytest.raises(ConfigError) as info:
        parse_config({"apiVersion": "y" * 3_000_000, "kind": "GpuConfig"}, where="c")
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("depth", [17, 1000, 3000])
def test_deep_parameters_fail_before_parsing(depth: int) -> None:
    nested: Any = "leaf"
    for _ in range(depth):
        nested = {"x": nested}
    with pytest.raises(ConfigError, match="nested deeper than 16"):
        parse_config({**_gpu(), "extra": nested}, where="c")


def test_wide_parameters_fail_before_parsing() -> None:
    with pytest.raises(ConfigError, match="more than 2048 values"):
        parse_config({**_gpu(), "extra": list(range(5000))}, where="c")


def _mps_config(per_device: dict[str, str]) -> Any:
    return parse_config(_gpu("MPS", mpsConfig={"defaultPerDevicePinnedMemoryLimit": per_device}), where="c")


def test_per_device_keys_must_name_a_device() -> None:
    uuids = ["GPU-aaa", "GPU-bbb"]
    check_device_keys(_mps_config({"0": "1Gi", "1": "1Gi", "GPU-bbb": "2Gi"}), devices=2, uuids=uuids, where="c")
    check_device_keys(None, devices=1, uuids=[], where="c")
    with pytest.raises(ConfigError, match=r"names no device of the claim: '2', 'GPU-zzz' \(use an index 0..1 or a UUID\)"):
        check_device_keys(_mps_config({"2": "1Gi", "GPU-zzz": "1Gi"}), devices=2, uuids=uuids, where="c")


@pytest.mark.parametrize(
    "params",
    [
        {"apiVersion": "gpu.dra.dev/v1alpha1", "kind": "GpuConfig", "sharing": "MPS"},
        _gpu("MPS", mpsConfig="50"),
        _gpu("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "5Ti"}),
        _gpu("MPS", timeSlicingConfig={}),
    ],
)
def test_config_errors_speak_the_users_language(params: Any) -> None:
    """The kubelet shows this text on the pod: no Python class names, no pydantic prefixes."""
    with pytest.raises(ConfigError) as info:
        parse_config(params, where="claim ns/c")
    text = str(info.value)
    for jargon in ("GpuSharing", "MpsConfig", "instance of", "Value error"):
        assert jargon not in text, text
