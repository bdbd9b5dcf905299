"""Fresh seeds for the node's claim-state model until time runs out.

``python -m tests.fuzz_state --seconds N`` (``make fuzz-state FUZZ_SECONDS=N``) runs the
model of :mod:`tests.unit.gpu.state.claim_model` with new random seeds in rounds until N
seconds have passed (no limit when N is 0 or unset). A failure is shrunk and its steps are
printed, as hypothesis prints them, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import traceback

import structlog
from hypothesis import HealthCheck, settings

from tests.unit.gpu.state.claim_model import run_model

ROUND = settings(
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)


def main(argv: list[str] | None = None) -> int:
    """Run rounds until the time is up or one fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.0, help="0: until interrupted")
    args = parser.parse_args(argv)
    # The driver's logs of thousands of claims drown the failing steps.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    started, rounds = time.monotonic(), 0
    while not args.seconds or time.monotonic() - started < args.seconds:
        try:
            run_model(ROUND)
        except Exception as exc:  # hypothesis re-raises the shrunk failure, steps in its notes
            traceback.print_exception(exc)
            print(f"fuzz-state: failed in round {rounds + 1}", file=sys.stderr)
            return 1
        rounds += 1
        elapsed = time.monotonic() - started
        print(
            f"fuzz-state: {rounds} rounds ({rounds * ROUND.max_examples} runs) in {elapsed:.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
