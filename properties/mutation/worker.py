"""`python -m blocktable.properties.mutation.worker JOB`: the fuzz engine on a
mutated copy of the package, its messages printed as JSON lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    import blocktable
    from blocktable.properties.run.messages import Message, job_from_json, to_json

    job = job_from_json(json.loads(sys.argv[1]))
    if job.expect_root is None:
        raise SystemExit("mutation worker: the job names no mutated tree (expect_root)")
    root = Path(job.expect_root).resolve()
    if root not in Path(blocktable.__file__).resolve().parents:
        raise SystemExit(f"mutation worker imported {blocktable.__file__}, not the mutated tree under {root}")
    from blocktable.properties.run.fuzz import fuzz_child
    from blocktable.properties.run.stateless import v2_stateless_child
    from blocktable.properties.run.workers import one_thread

    one_thread()  # mutants run side by side, one core's worth each (run/workers.py)

    def send(message: Message) -> None:
        print(json.dumps(to_json(message), default=str), flush=True)

    # A job naming V2 kernels is the stateless V2 mode (mutant.stateless_v2); the
    # lockstep's V2 worlds take ours from the environment.
    (v2_stateless_child if job.v2 else fuzz_child)(job, send)


if __name__ == "__main__":
    main()
