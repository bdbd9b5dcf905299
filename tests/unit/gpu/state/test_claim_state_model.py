"""The node's claim state against a model of the kubelet and the node (see
:mod:`tests.unit.gpu.state.claim_model`): a bounded run with a fixed seed. ``make fuzz-state``
runs fresh seeds for as long as it is given."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

from tests.unit.gpu.state.claim_model import NodeModel

NodeModel.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestClaimStateModel = NodeModel.TestCase
