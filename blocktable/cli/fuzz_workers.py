"""`blocktable fuzz --jobs N`: N fuzzing workers (properties/run/workers.py) behind one
live display, a line per worker and one for the total, and one summary with the
totals and each worker's rates. What happens after the run (a case confirmed and
written, a crash shrunk) is the single-process run's (blocktable/cli/fuzz.py)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from blocktable.cli.common import console
from blocktable.cli.progress import Bars, bars
from blocktable.properties.run import messages
from blocktable.properties.run.child import Target
from blocktable.properties.run.messages import Job, Log, Message, Result, Stats
from blocktable.properties.run.workers import Placement, WorkerOutcome, placements, run_workers, visible_gpus


@dataclass
class WorkersRun:
    """What the workers did. `result` decides the run: the result of the worker that
    ended it (a failure or a configuration error), or a pass with the totals; None
    when that worker died, and `ended_by` is the one whose journal holds the crash."""

    jobs: list[Job]
    places: list[Placement]
    outcomes: list[WorkerOutcome]
    stats: list[Stats]  # each worker's latest
    ended_by: int | None
    result: Result | None

    @property
    def total(self) -> Stats:
        return merged(self.stats)


def worker_jobs(job: Job, jobs: int, out: Path) -> list[Job]:
    """Worker i fuzzes with seed S + i (so a run with the same seed and jobs is
    repeated), journals to journal-<i>.jsonl and runs its share of --examples;
    --minutes applies to each worker."""
    if job.minutes is None and job.examples is not None:
        jobs = min(jobs, job.examples)  # no worker with nothing to do
    result = []
    for i in range(jobs):
        examples = job.examples
        if job.minutes is None and job.examples is not None:
            examples = job.examples // jobs + (1 if i < job.examples % jobs else 0)
        result.append(dataclasses.replace(job, seed=job.seed + i, examples=examples,
                                          journal=str(out / f"journal-{i + 1}.jsonl")))
    return result


def sharing_devices(work: list[Job], places: list[Placement]) -> list[Job]:
    """Each worker's job told how many workers share its GPU (a placement without
    one: the one device all such workers use)."""
    sharing = Counter(place.gpu for place in places)
    return [dataclasses.replace(job, device_sharers=sharing[place.gpu]) for job, place in zip(work, places)]


def merged(stats: list[Stats]) -> Stats:
    """The workers' totals; elapsed is the longest worker's."""
    total = Stats(examples=sum(s.examples for s in stats), steps=sum(s.steps for s in stats),
                  steps_with_tokens=sum(s.steps_with_tokens for s in stats),
                  operations=sum(s.operations for s in stats), elapsed=max((s.elapsed for s in stats), default=0.0))
    events: Counter[str] = Counter()
    for s in stats:
        events.update(s.events)
    total.events = dict(events)
    calls: Counter[str] = Counter()
    for s in stats:
        calls.update(s.calls)
    total.calls = dict(calls)
    if any(s.tokens is not None for s in stats):
        total.batches = sum(s.batches or 0 for s in stats)
        total.tokens = sum(s.tokens or 0 for s in stats)
    return total


def _name(i: int, job: Job) -> str:
    return f"worker {i + 1} (seed {job.seed})"


def run(target: Target, job: Job, jobs: int, out: Path, kernel: str, detail: Any) -> WorkersRun:
    """Run the workers behind the live display. detail(stats) is the line's text."""
    work = worker_jobs(job, jobs, out)
    places = placements(len(work), visible_gpus(job.device))
    work = sharing_devices(work, places)
    stats = [Stats() for _ in work]
    minutes = job.minutes
    progress: Bars | None = None
    tasks: list[Any] = []
    total_task: Any = None

    def share(w: Job) -> float:
        return minutes * 60 if minutes else float(w.examples or 0)

    def on_message(i: int, message: Message) -> None:
        nonlocal progress, total_task
        if isinstance(message, Log):
            console.print(f"worker {i + 1}: {message.text}", markup=False)
            return
        if not isinstance(message, messages.Progress):
            return
        stats[i] = message.stats
        if progress is None:  # a configuration error prints no line first
            progress = bars(console)
            # A log shows the total alone: a line per worker every few seconds is noise there.
            tasks.extend(progress.add(_name(k, w), share(w), logged=False) for k, w in enumerate(work))
            total_task = progress.add(f"fuzz {kernel}: {len(work)} workers",
                                      share(work[0]) if minutes else sum(share(w) for w in work))
        found = stats[i].first_failure_s is not None
        progress.update(tasks[i], stats[i].elapsed if minutes else stats[i].examples,
                        ("found a discrepancy, shrinking it; " if found else "") + detail(stats[i]))
        total = merged(stats)
        progress.update(total_task, total.elapsed if minutes else total.examples, detail(total))

    try:
        outcomes, ended_by = run_workers(target, work, places, on_message)
        for outcome in outcomes:
            if outcome.result is not None and outcome.result.stats is not None:
                stats[outcome.index] = outcome.result.stats
        if progress is not None:
            for i, outcome in enumerate(outcomes):
                passed = outcome.result is not None and outcome.result.status == "pass"
                progress.update(tasks[i], share(work[i]) if passed else None,
                                ("stopped: " if outcome.stopped else "") + detail(stats[i]))
            total = merged(stats)
            progress.update(total_task, total.elapsed if minutes else total.examples, detail(total))
    finally:
        if progress is not None:
            progress.stop()
    if ended_by is None:
        device = next((o.result.device for o in outcomes if o.result is not None), "")
        result: Result | None = Result("pass", device=device, stats=merged(stats))
    else:
        result = outcomes[ended_by].result
    return WorkersRun(work, places, outcomes, stats, ended_by, result)


def _verdict(run: WorkersRun, i: int) -> str:
    outcome = run.outcomes[i]
    if outcome.stopped:
        return "stopped"
    if outcome.result is None:
        return "[red]died[/]" if i == run.ended_by else "-"
    if outcome.result.status == "pass":
        return "[green]pass[/]"
    if outcome.result.status == "fail":
        at = run.stats[i].examples_to_failure
        where = "a contract example" if at == 0 else f"program {at}" if at else ""
        return "[red]discrepancy[/]" + (f" at {where}" if where else "")
    return outcome.result.status


def worker_table(run: WorkersRun) -> Table:
    """Each worker's seed, place, counts and rates: how evenly the host was shared."""
    stateless = any(s.tokens is not None for s in run.stats)
    table = Table(title="workers")
    columns = ["worker", "seed", "placed on"] + (["batches", "tokens", "tokens/s"] if stateless else
                                                 ["programs", "programs/s", "checked steps", "steps/s"])
    for column in columns + ["result"]:
        table.add_column(column, justify="right" if column not in ("placed on", "result") else "left")
    for i, (job, s) in enumerate(zip(run.jobs, run.stats)):
        seconds = max(s.elapsed, 1e-9)
        counts = ([f"{s.batches or 0}", f"{s.tokens or 0:,}", f"{(s.tokens or 0) / seconds:,.0f}"] if stateless else
                  [f"{s.examples}", f"{s.examples / seconds:.1f}", f"{s.steps}", f"{s.steps / seconds:.1f}"])
        table.add_row(str(i + 1), str(job.seed), run.places[i].describe(), *counts, _verdict(run, i))
    return table


def remove_journals(run: WorkersRun, keep: int | None = None) -> None:
    """Every worker's journal but the one that holds a crash."""
    for i, job in enumerate(run.jobs):
        if i != keep and job.journal:
            Path(job.journal).unlink(missing_ok=True)
