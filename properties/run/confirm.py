"""Replaying a case in fresh processes: what `blocktable replay` runs, how a new
case is confirmed before its file is written, and the interpreter's verdict on a
case the compiled kernel fails (triage)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blocktable.properties.cases.case import Case
from blocktable.properties.cases.confirmation import Confirmation, verdict
from blocktable.properties.report.build import crash_report
from blocktable.properties.report.report import Report
from blocktable.properties.run.child import describe_exit, run_in_child
from blocktable.properties.run.crash import crash_case
from blocktable.properties.run.messages import Failure, Job, Log, Message, Result
from blocktable.properties.run.replay import replay_child


@dataclass
class Attempt:
    """One replay of a case in a fresh process."""

    status: str  # "pass", "fail", "config-error" or "timeout" (stopped at the time limit)
    report: Report | None = None  # a failure's report (a crash's too)
    text: str = ""  # the configuration error, or what a crash with no case to replay said
    result: Result | None = None  # the child's Result; None when it died
    crashed: bool = False
    whole_run: bool = False  # this replay ran the case's whole run, not its program


def replay_attempt(kernel: str, device: str, case_path: Path, case_data: dict[str, Any] | None = None,
                   whole_run: bool = False, verbose: bool = False, kv: dict[str, str] | None = None,
                   on_log: Callable[[str], None] | None = None, strict_nan: bool = False,
                   until: float | None = None, call_timeout: float | None = None,
                   v2: dict[str, str] | None = None, classes: dict[str, str] | None = None) -> Attempt:
    """Replay the case at `case_path` (or `case_data`, the file not yet written) in a
    fresh process, its journal in a scratch folder so that a crash is reported too;
    stopped at `until` (time.monotonic()), a "timeout". `kv`, `v2`, `classes`: plug-ins that
    replace the ones the case ran with, by kind."""
    def on_message(message: Message) -> None:
        if on_log is not None and isinstance(message, Log):
            on_log(message.text)

    with tempfile.TemporaryDirectory() as scratch:
        journal = Path(scratch) / "journal.jsonl"
        job = Job(kernel, device=device, case=str(case_path), case_data=case_data, whole_run=whole_run,
                  verbose=verbose, journal=str(journal), kv=dict(kv or {}), strict_nan=strict_nan,
                  call_timeout=call_timeout, v2=dict(v2 or {}), classes=dict(classes or {}))
        outcome = run_in_child(replay_child, job, on_message, until)
        result = outcome.result
        if outcome.timed_out:
            return Attempt("timeout", text="the time limit (--minutes) came before the replay finished",
                           whole_run=whole_run)
        if result is None:
            case, message, where = crash_case(journal, outcome.exitcode, call_timeout)
            if case is None:
                return Attempt("fail", text=message, crashed=True, whole_run=whole_run)
            return Attempt("fail", crash_report(case, message, case_path, where, device), crashed=True,
                           whole_run=whole_run)
    if result.status == "config-error":
        return Attempt("config-error", text=result.message, result=result, whole_run=whole_run)
    if result.status == "pass" or result.failure is None:
        return Attempt("pass", result=result, whole_run=whole_run)
    return Attempt("fail", result.failure.report, result=result, whole_run=whole_run)


def replay_case(case: Case, kernel: str, device: str, case_path: Path, verbose: bool = False,
                kv: dict[str, str] | None = None, on_log: Callable[[str], None] | None = None,
                strict_nan: bool = False, call_timeout: float | None = None,
                v2: dict[str, str] | None = None, classes: dict[str, str] | None = None) -> Attempt:
    """What `blocktable replay` runs once: the case in a fresh process and, if that
    passes and the case keeps the whole run that found it (it did not fail alone in
    a fresh process when found), the whole run in another."""
    attempt = replay_attempt(kernel, device, case_path, verbose=verbose, kv=kv, on_log=on_log, strict_nan=strict_nan,
                             call_timeout=call_timeout, v2=v2, classes=classes)
    if attempt.status != "pass" or case.whole_run is None:
        return attempt
    return replay_attempt(kernel, device, case_path, whole_run=True, verbose=verbose, kv=kv, on_log=on_log,
                          strict_nan=strict_nan, call_timeout=call_timeout, v2=v2, classes=classes)


def confirm(case: Case, path: Path, kernel: str, device: str,
            on_stage: Callable[[str], None] | None = None, until: float | None = None,
            call_timeout: float | None = None, repeated_in_process: bool | None = None) -> Confirmation:
    """Replay a case (its file not yet written) in a fresh process and, if it passes
    there and keeps the whole run that found it, the whole run in another; each
    stopped at `until` (time.monotonic()), when given. `repeated_in_process`: whether
    the process that found it failed again when it replayed the case after its
    earlier calls (run/failure.py), which the verdict weighs too."""
    data = case.to_json()
    if on_stage is not None:
        on_stage("replaying the case in a fresh process")
    alone = replay_attempt(kernel, device, path, case_data=data, until=until, call_timeout=call_timeout)
    if alone.status == "timeout":
        return Confirmation(False, None, "not confirmed: the time limit (--minutes) came before the replay in a "
                                         "fresh process finished", repeated_in_process)
    reproduced = alone.status == "fail"
    whole_reproduced = None
    if not reproduced and case.whole_run is not None:
        if on_stage is not None:
            on_stage("replaying the whole run that found it in a fresh process")
        whole = replay_attempt(kernel, device, path, case_data=data, whole_run=True, until=until,
                               call_timeout=call_timeout)
        whole_reproduced = None if whole.status == "timeout" else whole.status == "fail"
    note = confirmation_note(reproduced, whole_reproduced, repeated_in_process)
    if alone.status == "config-error":
        note += f" (the replay could not start: {alone.text})"
    return Confirmation(reproduced, whole_reproduced, note, repeated_in_process)


def confirmation_note(reproduced: bool, whole_reproduced: bool | None, repeated_in_process: bool | None) -> str:
    """The verdict (cases/confirmation.verdict) in the words a case file keeps, with
    the replays that decided it."""
    found = verdict(reproduced, whole_reproduced, repeated_in_process)
    if found == "confirmed":
        return "fails again when replayed alone in a fresh process"
    if found == "state" and whole_reproduced:
        return ("passes alone in a fresh process, but the whole run that found it fails again there: the kernel "
                "keeps state from earlier calls and the failure depends on it")
    if found == "state":
        run = " (and so does the whole run that found it)" if whole_reproduced is False else ""
        return (f"passes alone in a fresh process{run}, but fails again in the process that found it, replayed "
                f"there after its earlier calls: the kernel keeps state from earlier calls (a table kept by "
                f"data_ptr sees other addresses in another process) and the failure depends on it")
    if found == "nondeterministic" and whole_reproduced is False:
        return ("neither the case alone nor the whole run that found it fails again in a fresh process: "
                "nondeterministic, or dependent on something outside the program")
    if found == "nondeterministic":
        return ("passes alone in a fresh process, and did not fail again when the process that found it replayed "
                "it: nondeterministic, or dependent on something outside the case")
    return ("passes when replayed in a fresh process: it depends on state from earlier calls in the same "
            "process, or is nondeterministic")


def finish(case: Case, confirmation: Confirmation, folder: Path) -> Path:
    """The one place a confirmed case is finished and written: it keeps its whole run
    only when the case alone did not fail again. OSError if it cannot be written."""
    case.confirmation = confirmation
    if confirmation.reproduced:
        case.whole_run = None  # not needed to replay it: the case alone fails
    return case.save(folder)


def interpreter_verdict(case: str, kernel: str, compiled: Failure) -> str:
    """Compare the compiled run's failure with an interpreter replay of the same case."""
    outcome = run_in_child(replay_child, Job(kernel, device="cpu", case=case))
    interp = outcome.result
    if interp is None:
        return f"the interpreter replay {describe_exit(outcome.exitcode)}; no verdict"
    if interp.status == "config-error":
        return f"the interpreter replay could not start: {interp.message}"
    if interp.status == "pass" or interp.failure is None:
        return ("reference = interpreter ≠ compiled: only the compiled kernel disagrees "
                "(a compiler, hardware or race issue, not the kernel's arithmetic)")
    seen = interp.failure
    if seen.step == compiled.step and seen.first and seen.first == compiled.first:
        return ("interpreter = compiled ≠ reference: the kernel's logic disagrees with the contract "
                "(the interpreter computes the same wrong slot)")
    return (f"reference, interpreter and compiled kernel all differ: the interpreter fails at step "
            f"{(seen.step or 0) + 1} on {seen.what}")
