"""A failure's report as a value, and its one rendering as text.

The process that found the failure builds the Report (report/build.py): the
kernels, device and configuration, the shrunk program, what failed with its element
decoded, and the command that replays it. The parent adds what it learnt after,
as fields (the confirmation in a fresh process, the triage on the interpreter),
and the command line renders it once, at the edge. Nothing reads the text back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from blocktable.properties.cases.confirmation import Confirmation, verdict
from blocktable.properties.report.describe import describe_step

TITLE = "blocktable found a discrepancy"


@dataclass
class Report:
    title: str
    kernel: str
    device: str
    config: str
    program: list[dict[str, Any]] | None  # a lockstep case's steps; None for a single call
    failed_step: int | None
    failure: list[str] = field(default_factory=list)  # what failed, decoded (report/describe.py)
    replay: str | None = None  # the command that replays the case
    case: str | None = None  # the case file
    crash: bool = False  # the process running the kernel died (the title says how)
    confirmation: Confirmation | None = None
    whole_run: str | None = None  # the whole run the case keeps, in words (report/describe.whole_run_text)
    repeated_in_process: bool | None = None  # whether the fuzzing process's own replay failed
    triage: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        data = dict(data)
        confirmation = data.pop("confirmation", None)
        return cls(**data, confirmation=Confirmation(**confirmation) if confirmation else None)


def render(report: Report) -> str:
    lines = [_title(report), f"  kernel:  {report.kernel}", f"  device:  {report.device}",
             f"  config:  {report.config}"]
    if report.program is not None:
        lines.append(f"  program ({len(report.program)} steps):")
        for i, step in enumerate(report.program):
            mark = "  <- fails here" if report.failed_step == i else ""
            lines.append(f"    {i + 1:3d}. {describe_step(step)}{mark}")
    lines += report.failure
    if report.triage:
        lines.append(f"  triage: {report.triage}")
    lines += confirmation_lines(report)
    if report.replay:
        lines.append(f"replay: {report.replay}")
    return "\n".join(lines)


def _title(report: Report) -> str:
    confirmation = report.confirmation
    if confirmation is None or confirmation.reproduced:
        return report.title
    if report.crash:
        return f"{report.title} (it did not repeat in a fresh process)"
    return "blocktable found a discrepancy that did not repeat in a fresh process"


def confirmation_lines(report: Report) -> list[str]:
    confirmation = report.confirmation
    if confirmation is None:
        return []
    if confirmation.reproduced:
        return ["  confirmed: it fails again when replayed alone in a fresh process"]
    lines = ["  not confirmed: replayed alone in a fresh process, it passes."]
    repeated = report.repeated_in_process
    if repeated is None:  # an older report: the case file's confirmation may know
        repeated = confirmation.repeated_in_process
    if repeated is False:
        lines.append("  nor did it fail when the process that found it replayed it after its earlier calls: the "
                     "failure above is the one first seen.")
    whole = report.whole_run
    found = verdict(False, confirmation.whole_run_reproduced, repeated)
    if found == "state" and confirmation.whole_run_reproduced and whole is not None:
        lines.append(f"  the whole run that found it ({whole}) fails again in a fresh process: "
                     f"the kernel keeps state from earlier calls (a cache keyed on the wrong inputs, a table kept "
                     f"by data_ptr) and this failure depends on it. The case file keeps the whole run, and "
                     f"replay replays it when the case alone passes.")
    elif found == "state":
        lines.append("  it fails again in the process that found it, replayed there after its earlier calls: the "
                     "kernel keeps state from earlier calls (a cache keyed on the wrong inputs, a table kept by "
                     "data_ptr) and this failure depends on it.")
        if confirmation.whole_run_reproduced is False and whole is not None:
            lines.append(f"  the whole run that found it ({whole}) passes in a fresh process: the state did not "
                         f"build up the same way there (a table kept by data_ptr sees other addresses in another "
                         f"process). The case file keeps the whole run.")
    elif found == "nondeterministic" and whole is not None:
        lines.append(f"  the whole run that found it ({whole}) passes in a fresh process too: "
                     f"the failure is nondeterministic (a race, memory never initialised) or depends on "
                     f"something outside the program. The case file keeps the whole run.")
    elif found == "nondeterministic":
        lines.append("  the failure is nondeterministic (a race, memory never initialised) or depends on "
                     "something outside the case.")
    else:
        lines.append("  it depends on state from earlier calls in the same process, or is nondeterministic "
                     "(a race, memory never initialised).")
    lines.append(f"  blocktable replay {report.case or 'CASE'} --repeat 20 counts how often it fails in fresh "
                 f"processes.")
    return lines
