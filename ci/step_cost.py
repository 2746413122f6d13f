"""The cost of a checked lockstep step with every kernel compiled: one process runs the
same seeded programs (`--examples N`) twice, the first pass compiling what Triton needs
and the second timed. A minute of `blocktable fuzz` on a fresh machine also pays
Triton's compilations on first use, and a faster run reaches programs (and kernel
variants) that a slower one never meets, so only the same programs, run again, give
the step's own cost. Compare settings by running this once for each, on one host:

    BLOCKTABLE_KV_WORLDS=0 python ci/step_cost.py --examples 120
    BLOCKTABLE_KV_WORLDS=1 python ci/step_cost.py --examples 120

Needs the package installed (`pip install -e .`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from blocktable.properties.run.fuzz import fuzz_child
from blocktable.properties.run.messages import Job, Message, Result, Stats


def run(job: Job) -> tuple[Stats, float]:
    """One fuzzing child in this process: its statistics and its wall time. Stops
    with an error unless it passed (a failing run's time is no step's cost)."""
    results: list[Result] = []

    def keep(message: Message) -> None:
        if isinstance(message, Result):
            results.append(message)

    start = time.perf_counter()
    fuzz_child(job, keep)
    elapsed = time.perf_counter() - start
    result = results[-1]
    if result.status != "pass" or result.stats is None:
        sys.exit(f"the run did not pass ({result.status}): time a passing run")
    return result.stats, elapsed


def one_pass(examples: int, seed: int, device: str, folder: str) -> tuple[Stats, float]:
    return run(Job("triton", device=device, seed=seed, examples=examples, out=folder,
                   journal=os.path.join(folder, "journal.jsonl")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=120, help="programs per pass (default 120)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    setting = {name: os.environ[name] for name in sorted(os.environ) if name.startswith("BLOCKTABLE_")}
    with tempfile.TemporaryDirectory() as folder:
        warm, warm_s = one_pass(args.examples, args.seed, args.device, folder)
        timed, timed_s = one_pass(args.examples, args.seed, args.device, folder)
    if timed.steps != warm.steps:
        sys.exit(f"the passes ran different programs ({warm.steps} and {timed.steps} steps): not comparable")
    print(f"{setting or 'defaults'}: {timed.steps} checked steps a pass; compiling pass {warm_s:.1f} s, "
          f"timed pass {timed_s:.1f} s = {timed.steps / timed_s:.1f} checked steps/s "
          f"({1000 * timed_s / timed.steps:.2f} ms a step)")


if __name__ == "__main__":
    main()
