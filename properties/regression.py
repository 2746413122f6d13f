"""What an emitted regression test calls: replay a case file in a fresh process (a
crashing kernel fails the test instead of killing pytest) and fail with the report
while the case still fails. A case that did not fail alone in a fresh process when
it was found keeps the whole run that found it; that is replayed too, as
`blocktable replay` does."""

from __future__ import annotations

import tempfile
from pathlib import Path

from blocktable.properties.case import load
from blocktable.properties.child import describe_exit, run_in_child
from blocktable.properties.messages import Job, Result


def _replay(path: Path, kernel: str, device: str, whole_run: bool) -> Result:
    with tempfile.TemporaryDirectory() as scratch:
        outcome = run_in_child("blocktable.properties.engine:replay_child",
                               Job(kernel, device=device, case=str(path), whole_run=whole_run,
                                   journal=str(Path(scratch) / "journal.jsonl")))
    result = outcome.result
    if result is None:
        raise AssertionError(f"{path.name}: the process replaying the case {describe_exit(outcome.exitcode)}")
    if result.status == "config-error":
        raise AssertionError(f"{path.name}: {result.message}")
    return result


def check_case(path: Path, kernel: str | None = None, device: str = "auto") -> None:
    path = Path(path)
    case = load(path)
    kernel = kernel or case.kernel
    result = _replay(path, kernel, device, whole_run=False)
    if result.status == "pass" and case.whole_run is not None:
        result = _replay(path, kernel, device, whole_run=True)
    if result.status != "pass":
        raise AssertionError(f"{path.name} still fails:\n{result.failure.report if result.failure else ''}")
