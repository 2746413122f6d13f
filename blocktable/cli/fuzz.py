"""`blocktable fuzz`: gate a slot-mapping kernel (ours or a plug-in) against the
reference. Exit 0: no discrepancy; 1: discrepancy (the case file is printed);
2: usage or configuration error."""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from blocktable.cli.common import (EXIT_FAIL, EXIT_PASS, UsageError, add_kernel_and_device, add_kv_kernels,
                                   check_folder, console, crash_case, make_folder, normalize_kernel, normalize_kv,
                                   render_crash, replay_attempt, usage_error, whole_run_text, write_case)
from blocktable.properties import messages
from blocktable.properties.messages import Failure, Job, Log, Message, Result, Stats

def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fuzz", help="fuzz a slot-mapping kernel and the block-table stack against the reference",
                       description=__doc__)
    add_kernel_and_device(p)
    add_kv_kernels(p)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--examples", type=int, metavar="N", help="lockstep examples to run (default: the profile's)")
    budget.add_argument("--minutes", type=float, metavar="M", help="fuzz for M minutes instead")
    p.add_argument("--seed", type=int, default=0, help="seed for the examples (default 0); same seed, same examples")
    p.add_argument("--profile", choices=["ci", "dev", "nightly"], default="ci",
                   help="Hypothesis profile: example sizes and program lengths (default ci)")
    p.add_argument("--out", type=Path, default=Path("blocktable-cases"),
                   help="folder for case files and the crash journal (default ./blocktable-cases)")
    p.add_argument("--stateless", action="store_true",
                   help="batched stateless fuzzing of the slot-mapping kernel alone, or with --kv-*, of each KV "
                        "kernel named (see docs/cli.md)")
    p.add_argument("--shrink-seconds", type=float, default=120, metavar="S",
                   help="when the kernel kills its process, spend up to S seconds replaying smaller "
                        "programs in fresh processes to shrink the crash (default 120; 0: keep it as found)")
    p.add_argument("--verbose", action="store_true",
                   help="reports show the whole exception chain of a kernel that raised")
    p.add_argument("--jobs", default="1", metavar="N|auto",
                   help="fuzzing processes at once, seeds SEED, SEED+1, ... (default 1; auto: the usable cores, "
                        "less one on a GPU host)")
    p.add_argument("--database", metavar="PATH|redis://HOST:PORT/N",
                   help="the Hypothesis example database every process reads first and saves failures to "
                        "(default: a folder under --out); see docs/fleet.md")
    p.add_argument("--database-readonly", action="store_true",
                   help="read --database without writing to it (pull-request runs); findings stay under --out")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UsageError as e:
        return usage_error("fuzz", str(e))


def _check(args: argparse.Namespace) -> None:
    if args.examples is not None and args.examples < 1:
        raise UsageError(f"--examples must be >= 1, got {args.examples}")
    if args.minutes is not None and not (math.isfinite(args.minutes) and args.minutes > 0):
        raise UsageError(f"--minutes must be a number > 0, got {args.minutes}")
    if not (args.shrink_seconds >= 0 and math.isfinite(args.shrink_seconds)):
        raise UsageError(f"--shrink-seconds must be a number >= 0, got {args.shrink_seconds}")
    if args.database_readonly and args.database is None:
        raise UsageError("--database-readonly needs --database: the shared database to read")


def _jobs(args: argparse.Namespace) -> int:
    from blocktable.properties.workers import parse_jobs

    def gpu_host() -> bool:
        import torch

        return args.device != "cpu" and torch.cuda.is_available()

    try:
        return parse_jobs(args.jobs, gpu_host)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _database(args: argparse.Namespace) -> str:
    """The --database to give the workers, checked (a Redis server must answer)."""
    from blocktable.properties.database import DEFAULT_FOLDER, check, check_reachable, is_redis

    if args.database is None:
        return str((args.out / DEFAULT_FOLDER).absolute())
    try:
        spec = check(args.database)
        if is_redis(spec):
            check_reachable(spec)
            return spec
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not args.database_readonly:
        check_folder(Path(spec), "--database")
    return str(Path(spec).absolute())


def _run(args: argparse.Namespace) -> int:
    from blocktable.properties import profiles

    _check(args)
    kernel = normalize_kernel(args.kernel)
    kv = {kind: normalize_kv(kind, getattr(args, f"kv_{kind}")) for kind in ("write", "copy", "gather")
          if getattr(args, f"kv_{kind}") is not None}
    kv_text = "; ".join(f"kv-{kind} {spec}" for kind, spec in kv.items())
    # What the progress line and the summary name: the kernels under test.
    shown = kv_text if args.stateless and kv else "; ".join(filter(None, [kernel, kv_text]))
    jobs = _jobs(args)
    database = _database(args)
    examples = args.examples if args.examples is not None or args.minutes else profiles.MACHINE_BUDGET[args.profile][0]
    made = make_folder(args.out, "--out")
    journal = args.out / "journal.jsonl"
    job = Job(kernel, device=args.device, examples=examples, minutes=args.minutes, seed=args.seed,
              profile=args.profile, out=str(args.out), journal=str(journal), verbose=args.verbose,
              database=database, database_readonly=args.database_readonly,
              **{f"kv_{kind}": spec for kind, spec in kv.items()})
    if args.stateless and kv:  # the KV kernels named, each alone (properties/kv_stateless.py)
        target = "blocktable.properties.kv_stateless:kv_stateless_child"
    elif args.stateless:
        target = "blocktable.properties.stateless:stateless_child"
    else:
        target = "blocktable.properties.engine:fuzz_child"
    start = time.monotonic()
    workers = None
    if jobs > 1:
        from blocktable.cli import fuzz_workers

        workers = fuzz_workers.run(target, job, jobs, args.out, shown, _detail)
        result, latest = workers.result, workers.total
        if result is None:  # a worker died: its journal has the fatal step
            fuzz_workers.remove_journals(workers, keep=workers.ended_by)
            died = workers.ended_by or 0
            console.print(f"worker {died + 1} (seed {workers.jobs[died].seed}) died; the others were stopped")
            return _crashed(args, workers.jobs[died], Path(workers.jobs[died].journal or journal),
                            workers.outcomes[died].exitcode)
        fuzz_workers.remove_journals(workers)
    else:
        result, exitcode, latest = _run_one(args, shown, job, target, examples)
        if result is None:  # the child died: the journal has the fatal step
            return _crashed(args, job, journal, exitcode)
    _remove_journal(journal, args.out if made else None, keep_folder=result.status == "fail")
    if result.status == "config-error":
        return usage_error("fuzz", result.message)
    _summary(shown, args, latest, result, time.monotonic() - start, workers)
    if result.status == "pass" or result.failure is None:
        console.print("[green]no discrepancy found[/]")
        return EXIT_PASS
    # A KV case names the KV kernel it failed on: that is what replays it.
    report = _confirm_and_save(result.failure, (result.failure.case_data or {}).get("kernel") or kernel, args.device)
    console.print(report, markup=False, soft_wrap=True)
    triage = _triage(result.failure, args)
    if triage:
        console.print(f"  triage: {triage}", markup=False, soft_wrap=True)
    console.print(f"case file: {result.failure.case}", soft_wrap=True)
    return EXIT_FAIL


def _run_one(args: argparse.Namespace, kernel: str, job: Job, target: str,
             examples: int) -> tuple[Result | None, int | None, Stats]:
    """One child behind one progress line: its result (None if it died), exit code
    and last stats."""
    from blocktable.properties.child import run_in_child

    latest = Stats()
    total = args.minutes * 60 if args.minutes else examples
    # The progress line starts with the child's first progress message, once the
    # device and the kernel are set up: a configuration error prints no line first.
    progress: Progress | None = None
    task: Any = None

    def on_message(message: Message) -> None:
        nonlocal latest, progress, task
        if isinstance(message, Log):
            console.print(message.text, markup=False)
            return
        if isinstance(message, messages.Progress):
            latest = message.stats
            if progress is None:
                progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                    TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console)
                progress.start()
                task = progress.add_task(f"fuzz {kernel}", total=total, detail="starting")
            done = latest.elapsed if args.minutes else latest.examples
            progress.update(task, completed=done, detail=_detail(latest))

    try:
        outcome = run_in_child(target, job, on_message)
        result = outcome.result
        if result is not None and progress is not None:
            latest = result.stats or latest
            progress.update(task, completed=total if result.status == "pass" else None, detail=_detail(latest))
    finally:
        if progress is not None:
            progress.stop()
    return result, outcome.exitcode, latest


def _remove_journal(journal: Path, made: Path | None, keep_folder: bool) -> None:
    """The journal only matters while the child may die; a run that ended leaves
    none behind, nor the --out folder it made and left empty."""
    journal.unlink(missing_ok=True)
    if made is not None and not keep_folder:
        try:
            made.rmdir()  # only if empty
        except OSError:
            pass


def _crashed(args: argparse.Namespace, job: Job, journal: Path, exitcode: int | None) -> int:
    """The child died mid-step: a case from the journal, shrunk, confirmed, saved.
    The journal stays beside it: the crash as it happened, before shrinking."""
    case, message, where = crash_case(journal, exitcode)
    if case is None:  # a stateless batch: the message says how to repeat it
        console.print(message, markup=False, soft_wrap=True)
        return EXIT_FAIL
    if case.kind == "lockstep":
        from blocktable.properties.engine import kv_specs

        case.kv = kv_specs(job)  # the KV plug-ins it ran with: its replays load them
    if case.kind == "lockstep" and case.program and args.shrink_seconds > 0:
        message = _shrink_crash(case, job, exitcode, args.shrink_seconds)
    path = case.path_in(args.out)
    confirmation = _confirm(case.to_json(), path, job.kernel, args.device)
    case.confirmation = confirmation
    write_case(case.to_json(), path)
    report = render_crash(case, message, path, where, args.device)
    console.print(_amend(report, confirmation, path, crash=True), markup=False, soft_wrap=True)
    console.print(f"case file: {path}", soft_wrap=True)
    return EXIT_FAIL


def _confirm(data: dict[str, Any], path: Path, kernel: str, device: str) -> dict[str, Any]:
    """Replay a case (its file not yet written) in a fresh process and, if it passes
    there and keeps the whole run that found it, the whole run in another: the
    case's confirmation record (properties/case.py)."""
    with Progress(TextColumn("[bold]confirming[/] {task.fields[detail]}"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("confirm", detail="replaying the case in a fresh process")
        alone = replay_attempt(kernel, device, path, case_data=data)
        reproduced = alone.status == "fail"
        whole_reproduced = None
        if not reproduced and data.get("whole_run") is not None:
            progress.update(task, detail="replaying the whole run that found it in a fresh process")
            whole_reproduced = replay_attempt(kernel, device, path, case_data=data, whole_run=True).status == "fail"
    if reproduced:
        note = "fails again when replayed alone in a fresh process"
    elif whole_reproduced:
        note = ("passes alone in a fresh process, but the whole run that found it fails again there: the kernel "
                "keeps state from earlier calls and the failure depends on it")
    elif whole_reproduced is False:
        note = ("neither the case alone nor the whole run that found it fails again in a fresh process: "
                "nondeterministic, or dependent on something outside the program")
    else:
        note = ("passes when replayed in a fresh process: it depends on state from earlier calls in the same "
                "process, or is nondeterministic")
    if alone.status == "config-error":
        note += f" (the replay could not start: {alone.text})"
    return {"reproduced": reproduced, "whole_run_reproduced": whole_reproduced, "note": note}


def _confirm_and_save(failure: Failure, kernel: str, device: str) -> str:
    """Confirm the child's case in a fresh process, write its file with the verdict
    (and the whole run when it did not repeat alone); the report, amended."""
    path = Path(failure.case)
    data = dict(failure.case_data or {})
    confirmation = _confirm(data, path, kernel, device)
    data["confirmation"] = confirmation
    if confirmation["reproduced"]:
        data.pop("whole_run", None)  # not needed to replay it: the case alone fails
    write_case(data, path)
    return _amend(failure.report, confirmation, path, whole=data.get("whole_run"),
                  repeated=failure.repeated_in_process)


def _amend(report: str, confirmation: dict[str, Any], path: Path, whole: dict[str, Any] | None = None,
           crash: bool = False, repeated: bool | None = None) -> str:
    from blocktable.properties.report import amend

    if confirmation["reproduced"]:
        return amend(report, lines=["  confirmed: it fails again when replayed alone in a fresh process"])
    title = report.splitlines()[0] if report else ""
    title = (f"{title} (it did not repeat in a fresh process)" if crash else
             "blocktable found a discrepancy that did not repeat in a fresh process")
    lines = ["  not confirmed: replayed alone in a fresh process, it passes."]
    if repeated is False:
        lines.append("  nor did it fail when the fuzzing process replayed it right after shrinking: the failure "
                     "above is the one Hypothesis saw.")
    if confirmation["whole_run_reproduced"] and whole is not None:
        lines.append(f"  the whole run that found it ({whole_run_text(whole)}) fails again in a fresh process: "
                     f"the kernel keeps state from earlier calls (a cache keyed on the wrong inputs, a table kept "
                     f"by data_ptr) and this failure depends on it. The case file keeps the whole run, and "
                     f"replay replays it when the case alone passes.")
    elif confirmation["whole_run_reproduced"] is False and whole is not None:
        lines.append(f"  the whole run that found it ({whole_run_text(whole)}) passes in a fresh process too: "
                     f"the failure is nondeterministic (a race, memory never initialised) or depends on "
                     f"something outside the program. The case file keeps the whole run.")
    else:
        lines.append("  it depends on state from earlier calls in the same process, or is nondeterministic "
                     "(a race, memory never initialised).")
    lines.append(f"  blocktable replay {path} --repeat 20 counts how often it fails in fresh processes.")
    return amend(report, title=title, lines=lines)


def _shrink_crash(case: Any, job: Job, exitcode: int | None, seconds: float) -> str:
    """Shrink a crashing lockstep program in place; the new crash message."""
    from blocktable.cli.common import describe_crash
    from blocktable.properties.crash import shrink_crash

    found = len(case.program)
    with Progress(TextColumn("[bold]shrinking the crash"), TextColumn("{task.fields[detail]}"),
                  TimeElapsedColumn(), console=console, transient=True) as progress, \
            tempfile.TemporaryDirectory() as scratch:
        task = progress.add_task("shrink", detail=f"{found} steps")
        shrunk = shrink_crash(dataclasses.replace(job, journal=str(Path(scratch) / "journal.jsonl")),
                              case.world.to_json(), case.program, exitcode, seconds,
                              lambda _, now: progress.update(task, detail=f"{found} -> {now} steps"))
    if shrunk.reproduced:
        case.program = shrunk.program
        console.print(f"shrunk the crash from {found} to {len(shrunk.program)} steps "
                      f"({shrunk.replays} replays in {shrunk.children} processes, {shrunk.seconds:.0f} s)")
    else:
        console.print("the crash did not repeat when its program was replayed in a fresh process; "
                      "the case keeps the program as it ran (flaky or order-dependent)")
    message = describe_crash(case, exitcode)
    case.failure["found_with_steps"] = found
    return message


def _detail(stats: Stats) -> str:
    if stats.tokens is not None:  # the stateless mode
        return f"{stats.batches} batches, {stats.tokens:,} tokens checked"
    return (f"{stats.examples} programs, {stats.steps} checked steps, "
            f"{len(stats.events)} kinds of event reached")


def _summary(kernel: str, args: argparse.Namespace, stats: Stats, result: Result, elapsed: float,
             workers: Any = None) -> None:
    """The run's totals; with several workers, the totals of all, then each one's."""
    table = Table(title="blocktable fuzz", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("kernel", kernel)
    table.add_row("device", result.device or args.device)
    if workers is None:
        table.add_row("profile / seed", f"{args.profile} / {args.seed}")
    else:
        seeds = [job.seed for job in workers.jobs]
        table.add_row("profile / seeds", f"{args.profile} / {seeds[0]}-{seeds[-1]}")
        table.add_row("workers", str(len(workers.jobs)))
    if stats.tokens is not None:
        table.add_row("batches / tokens checked", f"{stats.batches} / {stats.tokens:,}")
        # Several workers: over the longest worker's fuzzing time, as each worker's rate.
        seconds = stats.elapsed if workers is not None and stats.elapsed else elapsed
        table.add_row("tokens/s", f"{stats.tokens / max(seconds, 1e-9):,.0f}")
    else:
        steps, busy = stats.steps, stats.steps_with_tokens
        seconds = max(stats.elapsed or elapsed, 1e-9)
        # A bug falls at a program (Hypothesis's example), whatever its length: programs
        # per second is what a time to find a bug scales with.
        programs = stats.examples
        table.add_row("programs run (shrinking included) / operations",
                      f"{programs} ({programs / seconds:.1f}/s) / {stats.operations}")
        table.add_row("checked steps", f"{steps} ({steps / seconds:.1f}/s)")
        table.add_row("  of which scheduled tokens", f"{busy} ({busy / seconds:.1f}/s)")
        events = stats.events
        table.add_row("events reached", ", ".join(f"{k} ×{v}" for k, v in sorted(events.items())) or "-")
    table.add_row("elapsed", f"{elapsed:.1f} s")
    table.add_row("result", "[green]pass[/]" if result.status == "pass" else "[red]discrepancy[/]")
    console.print(table)
    if workers is not None:
        from blocktable.cli.fuzz_workers import worker_table

        console.print(worker_table(workers))


def _triage(failure: Failure, args: argparse.Namespace) -> str | None:
    """On a GPU: replay the case on the interpreter and say which side disagrees."""
    import torch

    if failure.kind not in ("lockstep", "slot-call"):
        return None
    if args.device == "cpu" or not torch.cuda.is_available():
        return None
    return interpreter_verdict(failure.case, normalize_kernel(args.kernel), failure)


def interpreter_verdict(case: str, kernel: str, compiled: Failure) -> str:
    """Compare the compiled run's failure with an interpreter replay of the same case."""
    from blocktable.properties.child import describe_exit, run_in_child

    outcome = run_in_child("blocktable.properties.engine:replay_child", Job(kernel, device="cpu", case=case))
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
