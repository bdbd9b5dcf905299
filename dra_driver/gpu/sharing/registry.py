"""The sharing strategies the driver knows, in the order their steps are taken (and undone
in reverse). A new strategy is one module with a :class:`~.strategy.Strategy` and one line here.
"""

from __future__ import annotations

from dra_driver.gpu.sharing.mps import Mps
from dra_driver.gpu.sharing.shared_gpus import SharedGpus
from dra_driver.gpu.sharing.strategy import Strategy
from dra_driver.gpu.sharing.timeslicing import TimeSlicing

STRATEGIES: tuple[Strategy, ...] = (TimeSlicing(), Mps(), SharedGpus())
