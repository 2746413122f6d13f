"""What the parent of a fuzzing run does with what its children report, after the
fuzzing itself: a failure is confirmed in a fresh process and its case written; a
child that died leaves a journal, which becomes a case that is shrunk in fresh
processes, confirmed and written; on a GPU the interpreter gives its verdict.

The command line shows progress through a `Display` and renders the reports these
return; nothing here prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from blocktable.properties.cases.case import Case
from blocktable.properties.report.build import crash_report
from blocktable.properties.report.report import Report
from blocktable.properties.run.confirm import confirm, finish, interpreter_verdict
from blocktable.properties.run.crash import crash_case, describe_crash, shrink_crash
from blocktable.properties.run.messages import Failure, Job

Update = Callable[[str], None]


@contextlib.contextmanager
def _quiet(activity: str, detail: str) -> Iterator[Update]:
    yield lambda detail: None


@dataclass
class Display:
    """How the parent's work shows: `note` prints a line; `activity(name, detail)` is
    a transient status while the work runs, updated through the function it yields."""

    note: Callable[[str], None] = lambda text: None
    activity: Callable[[str, str], AbstractContextManager[Update]] = _quiet


def confirm_and_save(failure: Failure, kernel: str, device: str, display: Display,
                     until: float | None = None, call_timeout: float | None = None) -> Report:
    """Confirm the child's case in a fresh process and write its file with the verdict
    (and the whole run when it did not repeat alone); the report, with the verdict.
    `until`: the time limit's end (run/budget.py)."""
    path = Path(failure.case)
    case = Case.from_json(failure.case_data)
    with display.activity("confirming", "replaying the case in a fresh process") as update:
        confirmation = confirm(case, path, kernel, device, on_stage=update, until=until, call_timeout=call_timeout,
                               repeated_in_process=failure.repeated_in_process)
    finish(case, confirmation, path.parent)
    return dataclasses.replace(failure.report, confirmation=confirmation)


@dataclass
class Crash:
    """A child that died: its report and case file, or only what it said where there
    is nothing to replay (a stateless batch, a death before the first step)."""

    message: str
    report: Report | None = None
    case: Path | None = None


def crashed(job: Job, journal: Path, exitcode: int | None, device: str, out: Path, shrink_seconds: float,
            display: Display, until: float | None = None) -> Crash:
    """The child died mid-step: a case from the journal, shrunk, confirmed, saved.
    The journal stays beside it: the crash as it happened, before shrinking.
    `until`: the time limit's end; shrinking stops at the child's shrink deadline."""
    case, message, where = crash_case(journal, exitcode, job.call_timeout)
    if case is None:
        return Crash(message)
    if case.kind == "lockstep":
        # The plug-ins it ran with beside the kernel: its replays load them.
        case.kv, case.v2, case.classes = dict(job.kv), dict(job.v2), dict(job.classes)
        if job.shrink_deadline is not None:
            shrink_seconds = min(shrink_seconds, job.shrink_deadline - time.monotonic())
            if shrink_seconds <= 0:
                case.failure["not_shrunk"] = "the time limit (--minutes) came before shrinking started"
                display.note("the time limit (--minutes) leaves no time to shrink the crash: the case keeps the "
                             "program as it ran")
        if case.program and shrink_seconds > 0:
            message = _shrink(case, job, exitcode, shrink_seconds, display)
    path = case.path_in(out)
    with display.activity("confirming", "replaying the case in a fresh process") as update:
        confirmation = confirm(case, path, job.kernel, device, on_stage=update, until=until,
                               call_timeout=job.call_timeout)
    finish(case, confirmation, out)
    # The replay line names the device it died on, not "auto".
    report = crash_report(case, message, path, where, case.provenance.get("replay_device", device))
    return Crash(message, dataclasses.replace(report, confirmation=confirmation), path)


def _shrink(case: Case, job: Job, exitcode: int | None, seconds: float, display: Display) -> str:
    """Shrink a crashing lockstep program in place; the new crash message."""
    assert case.world is not None
    found = len(case.program)
    with display.activity("shrinking the crash", f"{found} steps") as update, \
            tempfile.TemporaryDirectory() as scratch:
        shrunk = shrink_crash(dataclasses.replace(job, journal=str(Path(scratch) / "journal.jsonl")),
                              case.world.to_json(), case.program, exitcode, seconds,
                              lambda _, now: update(f"{found} -> {now} steps"))
    if shrunk.reproduced:
        case.program = shrunk.program
        display.note(f"shrunk the crash from {found} to {len(shrunk.program)} steps "
                     f"({shrunk.replays} replays in {shrunk.children} processes, {shrunk.seconds:.0f} s)")
    else:
        display.note("the crash did not repeat when its program was replayed in a fresh process; "
                     "the case keeps the program as it ran (flaky or order-dependent)")
    message = describe_crash(case, exitcode, job.call_timeout)
    case.failure["found_with_steps"] = found
    return message


def triage(failure: Failure, kernel: str, on_gpu: bool) -> str | None:
    """On a GPU: replay the case on the interpreter and say which side disagrees."""
    if failure.kind not in ("lockstep", "slot-call") or not on_gpu:
        return None
    return interpreter_verdict(failure.case, kernel, failure)
