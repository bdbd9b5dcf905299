"""The admission policy for opaque configs, generated from the config models.

- The policy in the chart and the kustomize base is what ``hack/gen_admission_policy.py``
  generates now.
- Its CEL compiles (in this package's CEL engine, with the policy's variables as ``dyn``;
  the real API server compiles it in tests/e2e/test_admission_policy.py).
- The policy, evaluated here, refuses exactly the configs the agent refuses, naming the field
  the agent names, on the tables of tests/unit/gpu/test_config.py and this file's own.
- Every validation agrees with its Python twin, and every model :class:`Rule`'s CEL with its
  ``holds``, on the same tables.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict

from dra_driver.cel.compiler import Compiler
from dra_driver.cel.environment import parse
from dra_driver.cel.limits import deep_recursion
from dra_driver.gpu import config as gpu_config
from dra_driver.gpu.config import OWN_API, ConfigError, ConfigKinds, Rule, parse_config
from dra_driver.gpu.nvidia_config import config_apis
from tests.unit.gpu import test_config

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.dra.dev"
V1 = "gpu.dra.dev/v1alpha1"


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_admission_policy", ROOT / "hack" / "gen_admission_policy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


# ------------------------------------------------------------------------------------
# The tables
# ------------------------------------------------------------------------------------


def _gpu(strategy: str = "TimeSlicing", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": V1, "kind": "GpuConfig", "sharing": {"strategy": strategy, **extra}}


def _mig(strategy: str = "MPS", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": V1, "kind": "MigDeviceConfig", "sharing": {"strategy": strategy, **extra}}


def _mps(**mps: Any) -> dict[str, Any]:
    return _gpu("MPS", mpsConfig=mps)


def _parametrized(test: Callable[..., Any]) -> list[Any]:
    """The first column of a test's ``pytest.mark.parametrize`` table."""
    (mark,) = [m for m in getattr(test, "pytestmark", []) if m.name == "parametrize"]
    return [row[0] for row in mark.args[1]]


#: Invalid configs: the tables of tests/unit/gpu/test_config.py, then more.
INVALID: list[Any] = [
    *_parametrized(test_config.test_invalid_configs_name_claim_request_and_field),
    *_parametrized(test_config.test_strict_config),
    _mps(defaultActiveThreadPercentage=500),
    _mps(defaultActiveThreadPercentage=-1),
    _mps(defaultActiveThreadPercentage=None, defaultPinnedDeviceMemoryLimit=7),
    _mps(defaultPinnedDeviceMemoryLimit="4097Gi"),
    _mps(defaultPinnedDeviceMemoryLimit="-1Gi"),
    _mps(defaultPinnedDeviceMemoryLimit="1048575"),
    _mps(defaultPinnedDeviceMemoryLimit=""),
    _mps(defaultPinnedDeviceMemoryLimit="x" * 300),
    _mps(defaultPerDevicePinnedMemoryLimit=None),
    _mps(defaultPerDevicePinnedMemoryLimit=["1Gi"]),
    _mps(defaultPerDevicePinnedMemoryLimit={"0": None}),
    _mps(defaultPerDevicePinnedMemoryLimit={"0": "1Gi", "GPU-a": "2Tb"}),
    _mps(extra=1),
    _gpu(interval="Long"),
    _gpu(timeSlicingConfig={"interval": None}),
    _gpu(timeSlicingConfig={"interval": 1}),
    _gpu(timeSlicingConfig="Long"),
    _gpu(timeSlicingConfig=[]),
    _gpu("MPS", mpsConfig="fast"),
    _gpu(None),
    _gpu(1),
    {"apiVersion": V1, "kind": "GpuConfig", "sharing": {}},
    {"apiVersion": V1, "kind": "GpuConfig", "sharing": "MPS"},
    {"apiVersion": V1, "kind": "GpuConfig", "sharing": []},
    {"apiVersion": V1, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}, "Sharing": None},
    {"apiVersion": V1},
    {"kind": "GpuConfig"},
    {},
    {"apiVersion": 1, "kind": "GpuConfig"},
    {"apiVersion": V1, "kind": ["GpuConfig"]},
    {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"},
    {"apiVersion": V1, "kind": "gpuconfig"},
    _mig("TimeSlicing", mpsConfig={"defaultActiveThreadPercentage": 10}),
    _mig("MPS", timeSlicingConfig=None),
    _mig("MPS", mpsConfig={"defaultActiveThreadPercentage": 0}),
    _mig("Exclusive"),
]

#: Valid configs: the agent accepts them, so must the policy.
VALID: list[Any] = [
    {"apiVersion": V1, "kind": "GpuConfig"},
    {"apiVersion": V1, "kind": "MigDeviceConfig"},
    {"apiVersion": V1, "kind": "GpuConfig", "sharing": None},
    _gpu(),
    _gpu(timeSlicingConfig={"interval": "Long"}),
    _gpu(timeSlicingConfig={}),
    _gpu(timeSlicingConfig=None),
    _gpu(mpsConfig=None),
    _gpu("MPS", timeSlicingConfig=None),
    _gpu("MPS"),
    _mps(),
    _mps(defaultActiveThreadPercentage=1),
    _mps(defaultActiveThreadPercentage=100),
    _mps(defaultActiveThreadPercentage=None),
    _mps(defaultPinnedDeviceMemoryLimit="1Mi"),
    _mps(defaultPinnedDeviceMemoryLimit="4Ti"),
    _mps(defaultPinnedDeviceMemoryLimit="1048576"),
    _mps(defaultPinnedDeviceMemoryLimit="1048575.5"),  # rounds up to 1Mi, as the agent reads it
    _mps(defaultPinnedDeviceMemoryLimit="1.5Gi"),
    _mps(defaultPinnedDeviceMemoryLimit="10G"),
    _mps(defaultPinnedDeviceMemoryLimit="1e9"),
    _mps(defaultPinnedDeviceMemoryLimit=None),
    _mps(defaultPerDevicePinnedMemoryLimit={}),
    _mps(defaultPerDevicePinnedMemoryLimit={"0": "5Gi", "GPU-aaa": "10Gi"}),
    _mps(
        defaultActiveThreadPercentage=50,
        defaultPinnedDeviceMemoryLimit="10Gi",
        defaultPerDevicePinnedMemoryLimit={"0": "5Gi"},
    ),
    _mig("MPS"),
    _mig("TimeSlicing"),
    _mig("MPS", mpsConfig={"defaultActiveThreadPercentage": 30}),
    _mig("TimeSlicing", mpsConfig=None),
]


def _example_params() -> Iterator[Any]:
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if not obj or obj.get("kind") not in ("ResourceClaim", "ResourceClaimTemplate"):
                continue
            spec = obj["spec"] if obj["kind"] == "ResourceClaim" else obj["spec"]["spec"]
            for config in spec.get("devices", {}).get("config", []):
                if config.get("opaque", {}).get("driver") == DRIVER:
                    yield config["opaque"]["parameters"]


EXAMPLES = list(_example_params())


def agent_error(params: Any, apis: ConfigKinds = OWN_API) -> str | None:
    try:
        parse_config(params, where="claim ns/c", apis=apis)
    except ConfigError as exc:
        return str(exc)
    return None


def api_server_refuses(params: Any) -> bool:
    """Parameters the API server refuses itself, before admission: not a JSON object, or
    more than 10 KiB of JSON."""
    return not isinstance(params, dict) or len(yaml.safe_dump(params)) > 10 * 1024


# ------------------------------------------------------------------------------------
# The policy, evaluated by this package's CEL engine
# ------------------------------------------------------------------------------------

VARIABLES = {"object": "dyn", "oldObject": "dyn", "request": "dyn", "variables": "dyn", "params": "dyn"}
Program = Callable[[dict[str, Any]], Any]


def compile_cel(expression: str) -> Program:
    with deep_recursion():
        fn: Program = Compiler(expression, VARIABLES).compile(parse(expression)).fn
    return fn


def run(fn: Program, scope: dict[str, Any]) -> Any:
    with deep_recursion():
        return fn(scope)


class Simulated:
    """A ValidatingAdmissionPolicy as the API server runs it (variables in order, then each
    validation; the first that fails gives the message)."""

    def __init__(self, policy: dict[str, Any]) -> None:
        spec = policy["spec"]
        self.conditions = [compile_cel(c["expression"]) for c in spec["matchConditions"]]
        self.variables = [(v["name"], compile_cel(v["expression"])) for v in spec["variables"]]
        self.validations = [
            (compile_cel(v["expression"]), compile_cel(v["messageExpression"]))
            for v in spec["validations"]
        ]

    def scope(self, obj: dict[str, Any], resource: str) -> dict[str, Any]:
        scope: dict[str, Any] = {
            "object": obj,
            "oldObject": None,
            "request": {"operation": "CREATE", "resource": {"resource": resource}},
            "variables": {},
        }
        for name, fn in self.variables:
            scope["variables"][name] = run(fn, scope)
        return scope

    def admit(self, obj: dict[str, Any], resource: str = "resourceclaims") -> str | None:
        """None when admitted, else the message."""
        scope = self.scope(obj, resource)
        assert all(run(c, scope) is True for c in self.conditions)
        for ok, message in self.validations:
            if run(ok, scope) is not True:
                text: str = run(message, scope)
                # The API server does not use a message with a line break (it falls back to
                # the static message).
                assert "\n" not in text and "\r" not in text, text
                return text
        return None


def claim(params: Any, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
                "config": [
                    {"opaque": {"driver": "other.example.com", "parameters": {"anything": 1}}},
                    {"requests": ["gpu"], "opaque": {"driver": driver, "parameters": params}},
                ],
            }
        }
    }


def template(params: Any) -> dict[str, Any]:
    return {"spec": {"spec": claim(params)["spec"]}}


def kustomize_policy() -> dict[str, Any]:
    policy: dict[str, Any] = yaml.safe_load_all(gen.KUSTOMIZE_FILE.read_text()).__next__()
    return policy


@pytest.fixture(scope="module")
def policy() -> Simulated:
    return Simulated(kustomize_policy())


def _id(value: Any) -> str:
    text = re.sub(r"\s+", "", str(value))
    return text if len(text) <= 90 else text[:87] + "..."


# ------------------------------------------------------------------------------------
# Up to date, compiles
# ------------------------------------------------------------------------------------


def test_committed_policy_is_generated_now() -> None:
    for path, text in gen.outputs().items():
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} is stale: run `.venv/bin/python hack/gen_admission_policy.py`"
        )
    assert gen.main(["--check"]) == 0


def test_kustomize_lists_the_policy() -> None:
    kustomization = yaml.safe_load((gen.KUSTOMIZE_FILE.parent / "kustomization.yaml").read_text())
    assert gen.KUSTOMIZE_FILE.name in kustomization["resources"]


def test_chart_follows_the_driver_name_and_the_value() -> None:
    text = gen.CHART_FILE.read_text()
    assert text.startswith("{{- if .Values.opaqueConfigPolicy.enabled }}\n")
    assert "expression: {{ include \"dra-driver.driverName\" . | quote | squote }}" in text
    assert DRIVER not in text.replace(V1, "")  # the driver's name only through the helper
    values = yaml.safe_load((gen.CHART_FILE.parents[1] / "values.yaml").read_text())
    assert values["opaqueConfigPolicy"] == {"enabled": True}


def test_cel_compiles() -> None:
    policy = kustomize_policy()
    spec = policy["spec"]
    expressions = [c["expression"] for c in spec["matchConditions"]]
    expressions += [v["expression"] for v in spec["variables"]]
    for v in spec["validations"]:
        expressions += [v["expression"], v["messageExpression"]]
        assert v["message"] and "\n" not in v["message"]
        assert v["reason"] == "Invalid"
    for expression in expressions:
        compile_cel(expression)
        assert "{{" not in expression and "}}" not in expression  # Helm would read them
    assert policy["spec"]["failurePolicy"] == "Fail"


# ------------------------------------------------------------------------------------
# The policy refuses what the agent refuses
# ------------------------------------------------------------------------------------


def _field_named(agent: str) -> str:
    """What the agent's message names: the field, or apiVersion / kind."""
    m = re.search(r"field '([^']*)'", agent)
    if m:
        return m.group(1)
    m = re.search(r"(apiVersion|kind) ", agent)
    assert m, agent
    return m.group(1)


@pytest.mark.parametrize("params", INVALID, ids=_id)
def test_invalid_configs_are_refused_naming_the_field(policy: Simulated, params: Any) -> None:
    agent = agent_error(params)
    assert agent is not None, "the table's config is valid for the agent"
    if api_server_refuses(params):
        return  # tests/e2e/test_admission_policy.py: refused before admission
    for obj, resource in ((claim(params), "resourceclaims"), (template(params), "resourceclaimtemplates")):
        message = policy.admit(obj, resource)
        assert message is not None, f"admitted, but the agent says: {agent}"
        path = "spec.spec.devices.config" if resource == "resourceclaimtemplates" else "spec.devices.config"
        assert message.startswith(f"{path}[1].opaque.parameters (config for gpu): "), message
        named = _field_named(agent)
        # The agent names a map's field, the policy the entry too (…Limit.0).
        assert named in message, (message, agent)


@pytest.mark.parametrize("params", VALID + EXAMPLES, ids=_id)
def test_valid_configs_pass(policy: Simulated, params: Any) -> None:
    assert agent_error(params) is None
    assert policy.admit(claim(params)) is None
    assert policy.admit(template(params), "resourceclaimtemplates") is None


def test_examples_have_opaque_configs() -> None:
    assert len(EXAMPLES) >= 2


def test_the_time_slicing_example_says_a_mistake_is_refused_when_created(policy: Simulated) -> None:
    """Its README tells users what a mistake in the config does. With the policy (on by default
    in the chart and the kustomize base) creating the template fails, naming the field; the
    pod never gets to ContainerCreating, which only happens without the policy."""
    (params,) = [p for p in EXAMPLES if p["sharing"]["strategy"] == "TimeSlicing"]
    sharing = params["sharing"]
    unknown_interval = {
        **params,
        "sharing": {**sharing, "timeSlicingConfig": {"interval": "Forever"}},
    }
    misspelt = {
        **params,
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfg": {"interval": "Long"}},
    }
    for mistake, field in ((unknown_interval, "interval"), (misspelt, "timeSlicingConfg")):
        message = policy.admit(template(mistake), "resourceclaimtemplates")
        assert message is not None and field in message, message
    readme = " ".join((ROOT / "examples" / "time-slicing" / "README.md").read_text().split())
    assert "creating the ResourceClaimTemplate is refused" in readme
    assert "opaqueConfigPolicy.enabled=false" in readme  # where the old behaviour still holds
    comment = (ROOT / "examples" / "time-slicing" / "time-slicing.yaml").read_text()
    assert "only the driver reads and validates it" not in comment


def test_configs_of_other_drivers_and_claims_without_configs_pass(policy: Simulated) -> None:
    assert policy.admit(claim({"sharng": 1}, driver="other.example.com")) is None
    assert policy.admit({"spec": {"devices": {"requests": [{"name": "gpu"}]}}}) is None
    assert policy.admit({"spec": {}}) is None
    assert policy.admit({"spec": {}}, "resourceclaimtemplates") is None


def test_message_names_the_config_and_its_requests(policy: Simulated) -> None:
    obj = claim(_mps(defaultActiveThreadPercentage=500))
    obj["spec"]["devices"]["config"][1]["requests"] = ["a", "b"]
    assert policy.admit(obj) == (
        "spec.devices.config[1].opaque.parameters (config for a, b): field "
        "'sharing.mpsConfig.defaultActiveThreadPercentage': Input should be an integer from 1 "
        "to 100, got 500"
    )
    del obj["spec"]["devices"]["config"][1]["requests"]
    message = policy.admit(obj)
    assert message is not None and "(config for all requests)" in message


def test_long_values_are_quoted_short(policy: Simulated) -> None:
    message = policy.admit(claim({"apiVersion": "y" * 5000, "kind": "GpuConfig"}))
    assert message is not None and len(message) < 250 and "'yyyy" in message


# ------------------------------------------------------------------------------------
# Python twins
# ------------------------------------------------------------------------------------

TABLE = [p for p in INVALID + VALID + EXAMPLES if not api_server_refuses(p)]
NVIDIA = "gpu.nvidia.com"
NVIDIA_API = "resource.nvidia.com/v1beta1"
#: The table again in the NVIDIA driver's API, for the driver installed in compat mode, with
#: what it reads differently.
NVIDIA_TABLE = [
    {**p, "apiVersion": NVIDIA_API} if isinstance(p, dict) and "apiVersion" in p else p
    for p in TABLE
] + [
    {"apiVersion": NVIDIA_API, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": m}}
    for m in (
        {"defaultActiveThreadPercentage": 0},
        {"defaultPinnedDeviceMemoryLimit": "8Ti"},
        {"defaultPinnedDeviceMemoryLimit": 10737418240},
        {"defaultPinnedDeviceMemoryLimit": 1.5e9},
        {"defaultPinnedDeviceMemoryLimit": 1048575},
        {"defaultPinnedDeviceMemoryLimit": 1048575.5},
        {"defaultPinnedDeviceMemoryLimit": 9223372036854775807},
        {"defaultPinnedDeviceMemoryLimit": False},
        {"defaultPerDevicePinnedMemoryLimit": {"0": 5368709120, "GPU-x": "2Gi"}},
        {"defaultPerDevicePinnedMemoryLimit": {"0": 512}},
        {"defaultPerDevicePinnedMemoryLimit": None},
        {"multiUser": True},
        {"multiUser": "yes"},
    )
]


@functools.cache
def installed_as(driver: str) -> Simulated:
    """The kustomize policy with the driver installed under another name."""
    text = gen.render_kustomize(gen.APIS).replace(f'"{DRIVER}"', f'"{driver}"', 1)
    (policy_obj, _) = yaml.safe_load_all(text)
    return Simulated(policy_obj)


def test_every_validation_agrees_with_its_python_twin(policy: Simulated) -> None:
    checks = gen.checks()
    spec = kustomize_policy()["spec"]
    assert len(checks) == len(spec["validations"])
    cases = [(DRIVER, policy, p) for p in TABLE]
    nvidia = installed_as(NVIDIA)
    cases += [(NVIDIA, nvidia, p) for p in NVIDIA_TABLE]
    for check, validation in zip(checks, spec["validations"], strict=True):
        assert validation["expression"] == check.expression()
        program = compile_cel(check.expression())
        failing = 0
        for driver, simulated, params in cases:
            scope = simulated.scope(claim(params, driver=driver), "resourceclaims")
            want = check.holds({"driver": driver, "parameters": params}, driver)
            assert run(program, scope) is want, (check.name, driver, params)
            failing += not want
        assert failing, f"no config of the table fails {check.name}"


def _all_rules() -> list[tuple[str, Rule]]:
    found = []
    for name in dir(gpu_config):
        model = getattr(gpu_config, name)
        if isinstance(model, type) and issubclass(model, BaseModel):
            found += [(model.__name__, r) for r in getattr(model, "rules", ())]
    return found


RULE_TABLE: list[Any] = [
    {},
    {"strategy": "MPS"},
    {"strategy": "MPS", "timeSlicingConfig": None},
    {"strategy": "MPS", "timeSlicingConfig": {}},
    {"strategy": "MPS", "timeSlicingConfig": "x"},
    {"strategy": "TimeSlicing", "mpsConfig": {}},
    {"strategy": "TimeSlicing", "mpsConfig": None},
    {"strategy": "TimeSlicing", "timeSlicingConfig": {}},
    {"strategy": 1, "mpsConfig": {}},
    {"strategy": None, "timeSlicingConfig": {}},
    {"mpsConfig": {}, "timeSlicingConfig": {}},
    {"defaultPerDevicePinnedMemoryLimit": {"": "1Gi"}},
    {"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi"}},
    {"defaultPerDevicePinnedMemoryLimit": None},
    {"defaultPerDevicePinnedMemoryLimit": [""]},
    {"defaultPerDevicePinnedMemoryLimit": ""},
]


@pytest.mark.parametrize(("model", "rule"), _all_rules(), ids=lambda r: r if isinstance(r, str) else r.message[:40])
def test_model_rules_cel_agrees_with_python(model: str, rule: Rule) -> None:
    program = compile_cel(gen.bind_self(rule.cel, "params"))
    verdicts = set()
    for obj in RULE_TABLE:
        want = rule.holds(obj)
        assert run(program, {"params": obj}) is want, (model, rule.cel, obj)
        verdicts.add(want)
    assert verdicts == {True, False}, "the table does not exercise the rule"


def test_rules_are_what_the_agent_checks() -> None:
    """The agent refuses what a rule refuses, with the rule's message."""
    for model, rule in _all_rules():
        assert model in ("GpuSharing", "MigSharing", "MpsConfig")
        del rule
    agent = agent_error(_gpu("MPS", timeSlicingConfig={}))
    assert agent is not None and "field 'sharing': timeSlicingConfig is set" in agent


# ------------------------------------------------------------------------------------
# The generator: a second API is one more registration; what it cannot do it says
# ------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ToyConfig(_Strict):
    api_version: str = "x"
    kind: str = "ToyConfig"


@pytest.mark.parametrize("params", NVIDIA_TABLE, ids=_id)
def test_in_compat_mode_the_policy_refuses_what_the_agent_refuses(params: Any) -> None:
    """Installed as gpu.nvidia.com, both config APIs are checked as the agent parses them
    with --compat nvidia."""
    error = agent_error(params, apis=config_apis("nvidia"))
    refusal = installed_as(NVIDIA).admit(claim(params, driver=NVIDIA))
    assert (refusal is None) is (error is None), (params, error, refusal)


def test_the_nvidia_api_is_refused_under_our_own_name(policy: Simulated) -> None:
    nvidia = {"apiVersion": NVIDIA_API, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    bad = policy.admit(claim(nvidia))
    assert bad is not None and f"apiVersion '{NVIDIA_API}' is not '{gen.API_GROUP_VERSION}'" in bad
    assert installed_as(NVIDIA).admit(claim(nvidia, driver=NVIDIA)) is None


def test_unsupported_schemas_are_errors() -> None:
    from typing import Literal

    from pydantic import Field

    class Loose(BaseModel):
        api_version: Literal["x/v1"] = Field(alias="apiVersion")
        kind: Literal["Loose"]

    class Union(_Strict):
        api_version: Literal["x/v1"] = Field(alias="apiVersion")
        kind: Literal["Union"]
        value: int | str = 0

    for model, words in ((Loose, "forbid unknown keys"), (Union, "unions")):
        with pytest.raises(gen.Unsupported, match=words):
            gen.checks((gen.ConfigApi("x/v1", (model,)),))
