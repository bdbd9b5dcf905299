"""The Kubernetes DRA CEL environment: compile and evaluate device selectors, explain results.

Parsing uses cel-python's grammar; evaluation compiles the tree to Python closures
(:mod:`dra_driver.cel.compiler`) with the Kubernetes libraries DRA selectors rely on.

>>> from dra_driver.cel import compile_selector, device_variables, evaluate
>>> program = compile_selector('device.attributes["gpu.dra.dev"].numaNode == 0')
>>> evaluate(program, device_variables({"attributes": {"numaNode": {"int": 0}}}, "gpu.dra.dev"))
Outcome(verdict=<Verdict.MATCH: 'match'>, error='')
"""

from dra_driver.cel.environment import (
    Outcome,
    Program,
    Verdict,
    compile_selector,
    device_variables,
    evaluate,
    evaluate_expression,
)
from dra_driver.cel.errors import CelError, CompileError, EvalError
from dra_driver.cel.explain import Explanation, explain
from dra_driver.cel.match import (
    Device,
    DeviceResult,
    Selector,
    SelectorSet,
    match_device,
    match_devices,
    prepare,
    selector_sets,
    slice_devices,
)

__all__ = [
    "CelError",
    "CompileError",
    "Device",
    "DeviceResult",
    "EvalError",
    "Explanation",
    "Outcome",
    "Program",
    "Selector",
    "SelectorSet",
    "Verdict",
    "compile_selector",
    "device_variables",
    "evaluate",
    "evaluate_expression",
    "explain",
    "match_device",
    "match_devices",
    "prepare",
    "selector_sets",
    "slice_devices",
]
