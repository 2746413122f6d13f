"""What the parent (the CLI, the mutation gate, an emitted regression test) and the
child processes that run harness work say to each other.

A child gets a `Job` and sends `Progress`, `Log` and, last, one `Result`; the
crash shrinker's replaying child also sends `Ready` and one `Answer` per program.
They cross a multiprocessing queue as they are (pickled), and the mutation worker
prints them as JSON lines (`to_json` / `from_json`), so every field is plain data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from blocktable.properties.report.report import Report


@dataclass
class Job:
    """The work a child is given. Which fields matter depends on the child: fuzzing
    reads the budget (`examples` or `minutes`), `seed`, `profile`, `out` and `verbose`;
    a replay reads `case` (or `case_data`), `whole_run` and `verbose`; the crash
    shrinker's child reads `world`."""

    kernel: str
    device: str = "auto"
    profile: str = "ci"
    seed: int = 0
    examples: int | None = None
    minutes: float | None = None
    out: str | None = None  # where case files go
    journal: str | None = None  # the crash journal; None: none kept
    case: str | None = None  # the case file to replay
    case_data: dict[str, Any] | None = None  # or the case itself, as its file would hold it (not yet written)
    whole_run: bool = False  # replay the case's whole run (case.whole_run) instead of its program
    verbose: bool = False  # replay: print every step; both: the whole exception chain in reports
    world: dict[str, Any] | None = None  # the crash shrinker's world, as JSON
    expect_root: str | None = None  # the mutation worker's mutated tree
    # The Hypothesis example database fuzzing reads and writes (properties/database.py):
    # a folder or redis:// URL; None: none. Read-only: read it, keep findings in `out`.
    database: str | None = None
    database_readonly: bool = False
    # The KV kernels (docs/contract.md §9) under test beside the slot-mapping kernel,
    # by kind ("write", "copy", "gather"), as Case.kv holds them; a kind not named: ours.
    kv: dict[str, str] = field(default_factory=dict)
    strict_nan: bool = False  # KV outputs' NaN encodings held exactly (docs/contract.md §9)
    # The V2 block-table kernels (docs/contract.md §10) under test, by kind ("append",
    # "gather", "slots"), as Case.v2 holds them; a kind not named: ours.
    v2: dict[str, str] = field(default_factory=dict)
    # The class plug-ins (docs/contract.md §11) under test, by kind ("pool"), as
    # Case.classes holds them; a kind not named: ours, directly.
    classes: dict[str, str] = field(default_factory=dict)
    # --minutes as times on time.monotonic() (run/budget.py): no program starts after
    # `deadline`; Hypothesis's shrinking of a finding stops at `shrink_deadline`.
    deadline: float | None = None
    shrink_deadline: float | None = None
    # The stateless slot-mapping batches' cap on tokens (--max-tokens); None: sized to the
    # device (run/stateless.py `batch_cap`), which `device_sharers` processes of this run share.
    max_tokens: int | None = None
    device_sharers: int = 1
    # Seconds a kernel call may take before the parent stops the child as hung; None: no watchdog.
    call_timeout: float | None = None

    def journal_path(self) -> Path:
        """The crash journal, which the children that fuzz or shrink must be given."""
        if self.journal is None:
            raise ValueError("this job keeps no crash journal, and its child needs one")
        return Path(self.journal)


@dataclass
class Stats:
    """A run's totals so far. The lockstep counts programs (`examples`) and steps; the
    stateless mode counts batches and tokens (and reports batches as examples)."""

    examples: int = 0
    steps: int = 0
    steps_with_tokens: int = 0
    operations: int = 0
    events: dict[str, int] = field(default_factory=dict)
    elapsed: float = 0.0
    first_failure_s: float | None = None  # seconds from the start to the first failing program
    examples_to_failure: int | None = None  # which program that was (0: a contract example)
    batches: int | None = None
    tokens: int | None = None
    calls: dict[str, int] = field(default_factory=dict)  # each kernel's calls, by kind (run/calls.py)


@dataclass
class Progress:
    phase: str
    stats: Stats


@dataclass
class Log:
    text: str


@dataclass
class Failure:
    """A failure as the parent needs it, field by field (the rendered report is for
    people; nothing parses it)."""

    kind: str  # the case's kind: "lockstep", "slot-call", "kv-call" or "v2-call"
    what: str  # the check that failed ("group 0 rank 1 slot mapping", "crash", ...)
    message: str
    config: str  # the world or the call, one line
    step: int | None  # the failing step's index in the program
    program_steps: int
    case: str  # the case file
    report: Report
    error: str = ""  # the exception's type and text, one line
    first: list[int] | None = None  # (token, expected, actual) of a slot mapping's first difference
    call: str | None = None  # a slot-mapping call's name (a contract example's)
    # The case as JSON, for the parent to replay in a fresh process before it writes
    # the file to `case` (the fuzz child writes no case file itself).
    case_data: dict[str, Any] | None = None
    repeated_in_process: bool | None = None  # the shrunk program failed again when replayed in the same process


@dataclass
class Result:
    status: Literal["pass", "fail", "config-error"]
    device: str = ""
    message: str = ""  # why a config-error
    stats: Stats | None = None
    failure: Failure | None = None


@dataclass
class Ready:
    """The crash shrinker's replaying child is set up."""


@dataclass
class Answer:
    """Whether one program the crash shrinker sent replayed without failing."""

    passed: bool


Message = Progress | Log | Result | Ready | Answer
_TYPES = {cls.__name__: cls for cls in (Progress, Log, Result, Ready, Answer)}


def to_json(message: Message) -> dict[str, Any]:
    return {"type": type(message).__name__, **dataclasses.asdict(message)}


def from_json(data: dict[str, Any]) -> Message:
    fields = dict(data)
    kind = _TYPES[fields.pop("type")]
    if kind is Progress:
        return Progress(fields["phase"], Stats(**fields["stats"]))
    if kind is Result:
        stats, failure = fields.pop("stats"), fields.pop("failure")
        if failure is not None:
            failure = Failure(**{**failure, "report": Report.from_json(failure["report"])})
        return Result(**fields, stats=Stats(**stats) if stats is not None else None, failure=failure)
    return kind(**fields)


def job_to_json(job: Job) -> dict[str, Any]:
    return dataclasses.asdict(job)


def job_from_json(data: dict[str, Any]) -> Job:
    return Job(**data)
