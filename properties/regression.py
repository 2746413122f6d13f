"""What an emitted regression test calls: replay a case file in a child process
(a crashing kernel fails the test instead of killing pytest) and fail with the
report while the case still fails."""

from __future__ import annotations

import tempfile
from pathlib import Path

from blocktable.properties.case import load
from blocktable.properties.child import describe_exit, run_in_child
from blocktable.properties.messages import Job


def check_case(path: Path, kernel: str | None = None, device: str = "auto") -> None:
    case = load(path)
    with tempfile.TemporaryDirectory() as scratch:
        outcome = run_in_child("blocktable.properties.engine:replay_child",
                               Job(kernel or case.kernel, device=device, case=str(path),
                                   journal=str(Path(scratch) / "journal.jsonl")))
    result = outcome.result
    if result is None:
        raise AssertionError(f"{path.name}: the process replaying the case {describe_exit(outcome.exitcode)}")
    if result.status == "config-error":
        raise AssertionError(f"{path.name}: {result.message}")
    if result.status != "pass":
        raise AssertionError(f"{path.name} still fails:\n{result.failure.report if result.failure else ''}")
