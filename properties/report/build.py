"""Reports built from a case and how its run ended: a discrepancy (in the process
that found it, where the exception and its traceback are), or a crash (in the
parent, from the case the journal left)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from blocktable.properties.cases.case import Case, family_flags
from blocktable.properties.outcome import Outcome
from blocktable.properties.report.describe import (
    case_config,
    case_kernels,
    failure_lines,
    kernel_flag,
    replay_command,
    whole_run_text,
)
from blocktable.properties.report.report import TITLE, Report


def discrepancy_report(case: Case, outcome: Outcome, device: str, case_path: Path, device_name: str,
                       title: str = TITLE, kernel_files: Iterable[str] = (), verbose: bool = False) -> Report:
    """`device`: where it ran, in words; `device_name`: the --device that replays it."""
    return Report(title=title, kernel=case_kernels(case), device=device, config=case_config(case),
                  program=case.program if case.kind == "lockstep" else None, failed_step=outcome.failed_step,
                  failure=failure_lines(outcome.error, outcome.failed_step, list(kernel_files), verbose),
                  replay=replay_command(case_path, case.kernel, device_name, family_flags(case), kernel_flag(case)),
                  case=str(case_path),
                  whole_run=whole_run_text(case.whole_run) if case.whole_run else None)


def crash_report(case: Case, message: str, case_path: Path, device: str, device_name: str) -> Report:
    """The process running the kernel died; `message` says how and where."""
    return Report(title=f"blocktable: {message}", kernel=case_kernels(case), device=device, config=case_config(case),
                  program=case.program if case.kind == "lockstep" else None, failed_step=case.failure.get("step"),
                  replay=replay_command(case_path, case.kernel, device_name, family_flags(case), kernel_flag(case)),
                  case=str(case_path),
                  crash=True)
