"""`blocktable fuzz`: gate a slot-mapping kernel (ours or a plug-in) against the
reference. Exit 0: no discrepancy; 1: discrepancy (the case file is printed);
2: usage or configuration error."""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from blocktable.cli.common import (EXIT_FAIL, EXIT_PASS, EXIT_USAGE, UsageError, add_kernel_and_device, console,
                                   crash_case, normalize_kernel, render_crash)
from blocktable.properties import messages
from blocktable.properties.messages import Failure, Job, Log, Message, Result, Stats


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fuzz", help="fuzz a slot-mapping kernel and the block-table stack against the reference",
                       description=__doc__)
    add_kernel_and_device(p)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--examples", type=int, metavar="N", help="lockstep examples to run (default: the profile's)")
    budget.add_argument("--minutes", type=float, metavar="M", help="fuzz for M minutes instead")
    p.add_argument("--seed", type=int, default=0, help="seed for the examples (default 0); same seed, same examples")
    p.add_argument("--profile", choices=["ci", "dev", "nightly"], default="ci",
                   help="Hypothesis profile: example sizes and program lengths (default ci)")
    p.add_argument("--out", type=Path, default=Path("blocktable-cases"),
                   help="folder for case files and the crash journal (default ./blocktable-cases)")
    p.add_argument("--stateless", action="store_true",
                   help="batched stateless fuzzing of the slot-mapping kernel alone (see docs/cli.md)")
    p.add_argument("--shrink-seconds", type=float, default=120, metavar="S",
                   help="when the kernel kills its process, spend up to S seconds replaying smaller "
                        "programs in fresh processes to shrink the crash (default 120; 0: keep it as found)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UsageError as e:
        console.print(f"[red]blocktable fuzz:[/] {e}")
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    from blocktable.properties import profiles
    from blocktable.properties.child import run_in_child

    if args.examples is not None and args.examples < 1:
        raise UsageError(f"--examples must be >= 1, got {args.examples}")
    if args.minutes is not None and args.minutes <= 0:
        raise UsageError(f"--minutes must be > 0, got {args.minutes}")
    if args.shrink_seconds < 0:
        raise UsageError(f"--shrink-seconds must be >= 0, got {args.shrink_seconds}")
    kernel = normalize_kernel(args.kernel)
    examples = args.examples if args.examples is not None or args.minutes else profiles.MACHINE_BUDGET[args.profile][0]
    args.out.mkdir(parents=True, exist_ok=True)
    journal = args.out / "journal.jsonl"
    job = Job(kernel, device=args.device, examples=examples, minutes=args.minutes, seed=args.seed,
              profile=args.profile, out=str(args.out), journal=str(journal))
    target = "blocktable.properties.stateless:stateless_child" if args.stateless else \
        "blocktable.properties.engine:fuzz_child"

    latest = Stats()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[detail]}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        total = args.minutes * 60 if args.minutes else examples
        task = progress.add_task(f"fuzz {kernel}", total=total, detail="starting")

        def on_message(message: Message) -> None:
            nonlocal latest
            if isinstance(message, Log):
                progress.console.print(message.text)
                return
            if isinstance(message, messages.Progress):
                latest = message.stats
                done = latest.elapsed if args.minutes else latest.examples
                progress.update(task, completed=done, detail=_detail(latest))

        start = time.monotonic()
        outcome = run_in_child(target, job, on_message)
        result = outcome.result
        if result is not None:
            latest = result.stats or latest
            progress.update(task, completed=total if result.status == "pass" else None, detail=_detail(latest))
    if result is None:  # the child died: the journal has the fatal step
        case, message, where = crash_case(journal, outcome.exitcode)
        if case is None:  # a stateless batch: the message says how to repeat it
            console.print(message, markup=False, soft_wrap=True)
            return EXIT_FAIL
        if case.kind == "lockstep" and case.program and args.shrink_seconds > 0:
            message = _shrink_crash(case, job, outcome.exitcode, args.shrink_seconds)
        path = case.save(args.out)
        console.print(render_crash(case, message, path, where, args.device), markup=False, soft_wrap=True)
        console.print(f"case file: {path}")
        return EXIT_FAIL
    if result.status == "config-error":
        console.print(f"[red]blocktable fuzz:[/] {result.message}")
        return EXIT_USAGE
    _summary(kernel, args, latest, result, time.monotonic() - start)
    if result.status == "pass" or result.failure is None:
        console.print("[green]no discrepancy found[/]")
        return EXIT_PASS
    console.print(result.failure.report, markup=False, soft_wrap=True)
    triage = _triage(result.failure, args)
    if triage:
        console.print(f"  triage: {triage}", markup=False, soft_wrap=True)
    console.print(f"case file: {result.failure.case}")
    return EXIT_FAIL


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


def _summary(kernel: str, args: argparse.Namespace, stats: Stats, result: Result, elapsed: float) -> None:
    table = Table(title="blocktable fuzz", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("kernel", kernel)
    table.add_row("device", result.device or args.device)
    table.add_row("profile / seed", f"{args.profile} / {args.seed}")
    if stats.tokens is not None:
        table.add_row("batches / tokens checked", f"{stats.batches} / {stats.tokens:,}")
        table.add_row("tokens/s", f"{stats.tokens / max(elapsed, 1e-9):,.0f}")
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
