"""A failure as a child sends it to the parent: the case as JSON (its file is not
written yet: the parent confirms it in a fresh process first), and the report,
built here, where the exception and its traceback are."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blocktable.device import Backend
from blocktable.properties.cases.case import Case
from blocktable.properties.outcome import Outcome
from blocktable.properties.report.build import discrepancy_report
from blocktable.properties.report.report import TITLE
from blocktable.properties.run.child import Send
from blocktable.properties.run.messages import Failure, Result, Stats
from blocktable.properties.slot.compare import first_difference


def device_name(backend: Backend) -> str:
    """The --device that replays on this backend."""
    return "cpu" if backend.interpreted else "cuda"


def kernel_files(kernel: Any) -> list[str]:
    """The file the kernel function is defined in, so that a report shows its frames
    even when it is an installed package's."""
    code = getattr(inspect.unwrap(kernel), "__code__", None) if kernel is not None else None
    return [code.co_filename] if code is not None else []


def describe_failure(case: Case, outcome: Outcome, backend: Backend, case_path: Path, title: str = TITLE,
                     kernel: Callable | None = None, verbose: bool = False) -> Failure:
    error = outcome.error
    report = discrepancy_report(case, outcome, backend.describe(), case_path, device_name(backend), title,
                                kernel_files(kernel), verbose)
    return Failure(kind=case.kind, what=getattr(error, "what", type(error).__name__), message=str(error),
                   config=report.config, step=outcome.failed_step, program_steps=len(case.program),
                   case=str(case_path), report=report,
                   error=f"{type(error).__name__}: {error}" if error is not None else "",
                   first=first_difference(error),
                   call=(case.call or {}).get("name") if case.kind in ("slot-call", "kv-call", "v2-call") else None)


def send_failure(send: Send, case: Case, outcome: Outcome, backend: Backend, out: Path, stats: Stats,
                 title: str = TITLE, kernel: Callable | None = None, verbose: bool = False,
                 repeated: bool | None = None, note: dict[str, Any] | None = None) -> None:
    """Send the result with the failure, its report and the case as JSON. The parent
    first replays the case in a fresh process and records whether it failed there,
    then writes the file (run/confirm.py)."""
    # Where it was found, as the --device that replays it there (replay's default).
    case.provenance.setdefault("replay_device", device_name(backend))
    case.provenance.setdefault("backend", backend.describe())
    case.failure = {"what": getattr(outcome.error, "what", type(outcome.error).__name__),
                    "message": str(outcome.error), "step": outcome.failed_step, **(note or {})}
    failure = describe_failure(case, outcome, backend, case.path_in(out), title, kernel, verbose)
    failure.case_data = case.to_json()
    failure.repeated_in_process = repeated
    failure.report.repeated_in_process = repeated
    send(Result("fail", device=backend.describe(), stats=stats, failure=failure))
