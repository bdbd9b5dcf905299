"""The runtime cost model against costs measured on the scheduler (no reference binary needed).

Each cost was measured with celref (the scheduler's CEL) on the corpus's H100 device, as the
largest ``n`` for which ``lists.range(n).size() >= 0 && (E)`` stays within the limit
(cost(E) = 1,000,000 - n - 13). The differential suite checks the limit itself; this table
names the rule a regression breaks: reads and qualifiers, folded constants, sizes of strings
and lists, conditional branches, each macro's iterations, the overload the scheduler knows.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.cel import cost
from dra_driver.cel.compiler import Compiler
from dra_driver.cel.environment import OBJECTS, VARIABLES, compile_selector, device_variables, parse
from tests.unit.cel.corpus import DEVICES

H100 = DEVICES[0]


def cost_of(expression: str, device: Any = H100) -> int:
    """What evaluating ``expression`` on ``device`` costs, counted whatever its bound."""
    node = Compiler(expression, VARIABLES, OBJECTS, counting=True).compile(parse(expression))
    variables = {**device_variables(device.device, device.driver), cost.KEY: [node.cost]}
    assert node.fn(variables) is True
    counted: int = variables[cost.KEY][0]
    return counted


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("!(device.driver in ['x', 'y'])", 3),
        ("!(device.driver in ['x', device.driver + 'y'])", 19),
        ("!(device.driver in dyn([device.driver + 'x']))", 19),
        ("!(device.driver in {'x': 1})", 4),
        ("'abc' + device.driver != ''", 4),
        ("'abc' < device.driver", 3),
        ("'abc'.indexOf('b') == 1", 1),
        ("'abcdefghijklmnopqrsté'.indexOf('x') == -1", 3),
        ("'x' in ['x', 'y']", 0),
        ("(device.driver == 'gpu.dra.dev' ? device.driver : 'x') == 'gpu.dra.dev'", 7),
        ("(true ? device.driver.size() : 0) == 11", 4),
        ("-(1) == -1", 2),
        ("1 in [1, 2 + 0]", 13),
        ("['b', 'a'].sort()[0] == 'a'", 22),
        ("[1, 1, 2].distinct().size() == 2", 31),
        ("[1, 2 + 0][0] == 1", 14),
        ("[1, 2, 3].all(x, x > 0)", 16),
        ("[1, 2, 3].exists(x, x > 2)", 19),
        ("[1, 2].exists(x, x == 1)", 10),
        ("[1, 2].all(x, x == 3) == false", 9),
        ("[1, 2, 3].exists_one(x, x > 2)", 10),
        ("[1, 2, 3].filter(x, x > 1).size() == 2", 35),
        ("[1, 2, 3].map(x, x + 1).size() == 3", 45),
        ("[1, 2, 3].map(x, x > 1, x + 1).size() == 2", 37),
        ("[1, 2, 3].transformMap(i, v, v + 1).size() == 3", 18),
        ("[1, 2, 3].slice(0, 2).size() == 2", 15),
        ("[[1, 2], [3]].flatten().size() == 3", 15),
        ("[1, 2].sum() == 3", 3),
        ("[3, 1, 2].sortBy(x, x)[0] == 1", 74),
        ("[3, 1, 2].sortBy(x, dyn(x))[0] == 1", 49),
        ("[3, 1].sort() == [1, 3]", 20),
        ("dyn([3, 1]).sort() == [1, 3]", 2),
        ("[?optional.of(device.driver)].size() == 1", 15),
        ("[].all(x, true)", 1),
        ("b'abc' + b'def' == b'abcdef'", 2),
        ("bytes(device.driver).size() == 11", 6),
        ("cel.bind(a, 'xxxxxxxxxx', '%s%s'.format([a, a]).size() > 0)", 15),
        ("cel.bind(a, 'xxxxxxxxxx', [a, a].join('').size() > 0)", 18),
        ("cel.bind(a, 'xxxxxxxxxx', a.matches(a))", 8),
        ("cel.bind(a, 'xxxxxxxxxx', a.replace('x', 'yy').size() > 0)", 5),
        ("cel.bind(a, 'xxxxxxxxxx', a.split('').size() > 0)", 5),
        (
            "cel.bind(a, 'xxxxxxxxxx', cel.bind(b, a + a, cel.bind(c, b + b, cel.bind(d, c + c, d == c + c))))",
            39,
        ),
        ("cel.bind(a, 'ééééééééééé', a.indexOf('y') < 0)", 4),
        ("cel.bind(m, 1, (true ? m : 2) == 1)", 1),
        ("cel.bind(m, {'a': 1}, (true ? m.a : 2) == 1)", 2),
        ("cel.bind(m, {'a': 1}, cel.bind(k, 'a', m[k] == 1))", 3),
        ("cel.bind(m, {'a': 1}, has(m.a))", 1),
        ("cel.bind(s, 1, true)", 0),
        (
            'cel.bind(v0, device.attributes["gpu.dra.dev"].productName, cel.bind(v1, v0 + v0, v1.size() > 0))',
            10,
        ),
        ("cel.bind(v0, device.driver, cel.bind(v1, v0 + dyn(v0), v1.size() > 0))", 11),
        ("cidr('0.0.0.0/0') != cidr('10.0.0.0/8')", 2),
        ("cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16')", 6),
        ("cidr('10.0.0.0/8').containsIP(ip('10.1.2.3'))", 3),
        ("cidr('10.0.0.0/8').ip() == ip('10.0.0.0')", 4),
        ("device.attributes[\"gpu.dra.dev\"].productName == 'NVIDIA H100 80GB HBM3'", 7),
        ("device.attributes[\"gpu.dra.dev\"].productName.contains('H')", 7),
        ("device.attributes['gpu.dra.dev'].?nothing.orValue(device.driver) != ''", 5),
        ("device.attributes['gpu.dra.dev'].?productName.optMap(x, x + 'y').orValue('') != ''", 15),
        ("device.attributes['gpu.dra.dev'].all(k, k != '')", 36),
        ("device.attributes['gpu.dra.dev'].numaNode == 0", 5),
        ("device.attributes['gpu.dra.dev'][device.driver.substring(0, 0) + 'numaNode'] == 0", 10),
        ("device.capacity['gpu.dra.dev'].memory.isGreaterThan(quantity('1'))", 6),
        ("device.driver == '' ? 1 == 1 : 2 == 2", 3),
        ("device.driver.find('gpu') == 'gpu'", 5),
        ("device.driver.format([]) == device.driver", 8),
        ("device.driver.lastIndexOf('d') == 8", 4),
        ("device.driver.split('.').join('-') == 'gpu-dra-dev'", 10),
        ("device.driver.startsWith('gpu')", 3),
        ("device.driver.trim() == device.driver", 8),
        ("duration('1h') > duration('30m')", 1),
        ("format.dns1123Label().validate('ok').hasValue() == false", 11),
        ("format.uri().validate(device.driver).hasValue()", 556),
        ("google.protobuf.Int64Value{value: 1} == 1", 41),
        ("google.protobuf.Struct{fields: {'a': device.driver}}.size() == 1", 74),
        ("has(device.attributes['gpu.dra.dev'].numaNode)", 3),
        ("has({'a': 1}.a)", 1),
        ("int('1') == 1", 1),
        ("ip('10.0.0.1') in [ip('10.0.0.1')]", 13),
        ("ip.isCanonical('10.0.0.1')", 2),
        ("lists.range(3).all(x, x >= 0)", 30),
        ("null in [null]", 1),
        ("optional.none().optMap(x, x + 1).hasValue() == false", 5),
        ("optional.none().or(optional.of(device.driver)).value() != ''", 5),
        ("optional.of(1).optMap(x, x + 1).value() == 2", 9),
        ("quantity('1') == quantity('1')", 3),
        ("sets.equivalent([1, 2], [2, 1])", 9),
        ("string(bytes(device.driver)) == device.driver", 10),
        ("strings.quote(device.driver).size() > 0", 6),
        ("url('https://example.com/a').getHost() == 'example.com'", 6),
        ("{'a': 1 + 0}['a'] == 1", 34),
        ("{'a': 1, 'b': 2}.filter(k, k == 'a').size() == 1", 20),
        ("{'a': 1}['a'] == 1", 3),
        ("{'a': device.driver}.transformMap(k, v, v + k).size() == 1", 42),
    ],
)
def test_cost_as_measured_on_the_scheduler(expression: str, expected: int) -> None:
    assert cost_of(expression) == expected


@pytest.mark.parametrize(
    "expression",
    [
        'device.attributes["gpu.dra.dev"].productName.matches("^NVIDIA (H100|A100)")',
        'device.capacity["gpu.dra.dev"].memory.compareTo(quantity("40Gi")) >= 0',
        "device.driver + 'x' == 'y' && device.driver.contains('gpu')",
        "'" + "x" * 9_000 + "' != device.driver",
        "true" + " " * 99_000,
    ],
)
def test_bounded_selectors_carry_no_counter(expression: str) -> None:
    # Far from the limit whatever the device (its strings are at most 64 characters).
    assert not compile_selector(expression).costed


@pytest.mark.parametrize(
    "expression",
    [
        "[1].all(x, x > 0)",
        "lists.range(3).size() == 3",
        "cel.bind(s, device.driver, s == '')",
        "device.driver.replace('a', 'aa') != ''",
        "[device.driver].join('') != ''",
        "'%s'.format([device.driver]) != ''",
        "sets.contains([1], [1])",
        "[2, 1].sort() == [1, 2]",
        "'" + "x" * 20_000 + "'.contains('" + "x" * 20_000 + "')",
    ],
)
def test_selectors_that_can_reach_the_limit_count(expression: str) -> None:
    assert compile_selector(expression).costed
