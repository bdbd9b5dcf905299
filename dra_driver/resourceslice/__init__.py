"""Driver-agnostic ResourceSlice publishing: desired pool -> plan -> API writes.

Knows nothing of GPUs: a driver describes its devices as ``resource.k8s.io/v1`` JSON, wraps
them in a :class:`DesiredPool` and hands that to a :class:`SliceController`.
"""

from dra_driver.resourceslice.cleanup import delete_pool_slices
from dra_driver.resourceslice.controller import SliceController
from dra_driver.resourceslice.planner import Plan, plan
from dra_driver.resourceslice.pool import DesiredPool, NodeOwner, SliceContent, contents_for

__all__ = [
    "DesiredPool",
    "NodeOwner",
    "Plan",
    "SliceContent",
    "SliceController",
    "contents_for",
    "delete_pool_slices",
    "plan",
]
