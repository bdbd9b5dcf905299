"""Differential test: the project's CEL engine against the scheduler's (``testenv/cmd/celref``).

(a) the curated corpus of :mod:`tests.unit.cel.corpus`, every selector on every device;
(b) random selectors over random devices from :mod:`tests.unit.cel.generator`: 10,000 with a
fixed seed here, unbounded with a fresh seed under ``make fuzz-cel`` (``CEL_FUZZ=1``).

Any difference in verdict (true / false / error, or compiled vs rejected) fails, printing the
selector, the device and both verdicts.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.unit.cel import generator
from tests.unit.cel.corpus import COST_BOUNDARY, DEVICES, KNOWN, SELECTORS
from tests.unit.cel.differential import compare, describe
from tests.unit.cel.reference import BINARY, MISSING, Reference

pytestmark = pytest.mark.skipif(not BINARY.exists(), reason=MISSING)

FUZZ = os.environ.get("CEL_FUZZ") == "1"
#: Generated selectors per example, and examples: 100 x 100 = 10,000 selectors in CI.
BATCH = 100
EXAMPLES = 100


@pytest.fixture(scope="module")
def reference() -> Iterator[Reference]:
    ref = Reference()
    yield ref
    ref.close()


@pytest.fixture(scope="module")
def corpus_disagreements(reference: Reference) -> dict[str, str]:
    """Selector -> description of its disagreements, for the whole corpus in one batch."""
    found = compare(reference, SELECTORS, DEVICES)
    by_selector: dict[str, list[tuple[str, int, object, object]]] = {}
    for entry in found:
        by_selector.setdefault(entry[0], []).append(entry)
    return {s: describe(entries, DEVICES) for s, entries in by_selector.items()}  # type: ignore[arg-type]


def _test_id(selector: str) -> str:
    # Selectors past the API's length limit are part of the corpus: keep their test ids short.
    if len(selector) <= 200:
        return selector
    return f"{selector[:60]}...{selector[-40:]}[{len(selector)} chars, {zlib.crc32(selector.encode()):08x}]"


def _corpus_params() -> list[object]:
    return [
        pytest.param(
            s,
            id=_test_id(s),
            marks=[pytest.mark.xfail(reason=KNOWN[s], strict=True)] if s in KNOWN else [],
        )
        for s in SELECTORS
    ]


@pytest.mark.parametrize("selector", _corpus_params())
def test_curated(selector: str, corpus_disagreements: dict[str, str]) -> None:
    assert selector not in corpus_disagreements, corpus_disagreements[selector]


def test_curated_with_list_type_attributes_on() -> None:
    # The gate changes the declared attribute type (dyn instead of Any); the engine follows
    # the default, and no verdict of the corpus depends on the difference.
    reference = Reference(BINARY, "--list-type-attributes")
    try:
        found = compare(reference, SELECTORS, DEVICES)
    finally:
        reference.close()
    assert not found, describe(found, DEVICES)


@pytest.mark.parametrize("selector", COST_BOUNDARY, ids=[_test_id(s) for s in COST_BOUNDARY])
def test_cost_boundary(reference: Reference, selector: str) -> None:
    found = compare(reference, [selector], DEVICES[2:3])
    assert not found, describe(found, DEVICES[2:3])


def test_known_list_is_part_of_the_corpus() -> None:
    assert set(KNOWN) <= set(SELECTORS)


_generated = settings(
    max_examples=10**9 if FUZZ else EXAMPLES,
    derandomize=not FUZZ,
    deadline=None,
    database=None,
    # Shrinking a batch of 100 selectors takes minutes; the message already names each pair.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@_generated
@given(
    st.lists(generator.selectors(), min_size=BATCH, max_size=BATCH),
    st.lists(generator.devices(), min_size=4, max_size=4),
)
def test_generated(reference: Reference, selectors: list[str], devices: list[object]) -> None:
    found = compare(reference, selectors, devices)  # type: ignore[arg-type]
    assert not found, describe(found, devices)  # type: ignore[arg-type]
