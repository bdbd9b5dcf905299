"""Run the interleavings scenario with fresh random seeds until told to stop or one fails.

    python -m tests.fuzz_async --seconds 600   # ten minutes of seeds
    python -m tests.fuzz_async                 # until interrupted or a seed fails
    python -m tests.fuzz_async --seed 1234     # one seed again

Each seed runs the scenario of ``tests/unit/test_interleavings.py`` (components, churn,
checks). The first failing seed is printed with its problems and how to run it again, and
the exit status is 1; otherwise 0.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from tests.unit.interleave import SEED_ENV
from tests.unit.test_interleavings import describe, run_seed


def main(argv: list[str] | None = None) -> int:
    """Run seeds as the arguments say; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz_async", description=__doc__)
    parser.add_argument(
        "--seconds", type=float, default=0.0, help="stop starting seeds after this (0: never)"
    )
    parser.add_argument("--seed", type=int, help="run this one seed instead")
    args = parser.parse_args(argv)
    fresh = random.SystemRandom()
    started = time.monotonic()
    runs = 0
    try:
        while True:
            seed = args.seed if args.seed is not None else fresh.randrange(2**32)
            outcome = run_seed(seed)
            runs += 1
            if outcome.failures:
                print(describe(outcome), flush=True)
                print(
                    f"\nrun it again: {SEED_ENV}={seed} .venv/bin/python -m pytest -q "
                    "tests/unit/test_interleavings.py  (or: python -m tests.fuzz_async "
                    f"--seed {seed})",
                    flush=True,
                )
                return 1
            print(f"seed {seed}: ok in {outcome.seconds:.1f}s", flush=True)
            if args.seed is not None:
                return 0
            if args.seconds and time.monotonic() - started >= args.seconds:
                break
    except KeyboardInterrupt:
        pass
    print(f"{runs} seeds passed in {time.monotonic() - started:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
