"""`blocktable fuzz`: gate a slot-mapping kernel (ours or a plug-in) against the
reference. Exit 0: no discrepancy; 1: discrepancy (the case file is printed);
2: usage or configuration error."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from blocktable import device
from blocktable.cli.common import (
    DISPLAY,
    EXIT_FAIL,
    EXIT_PASS,
    UsageError,
    add_call_timeout,
    add_classes,
    add_kernel_and_device,
    add_kv_kernels,
    add_v2_kernels,
    check_folder,
    class_specs,
    console,
    interrupted,
    make_folder,
    normalize_kernel,
    normalize_kv,
    usage_error,
    v2_specs,
)
from blocktable.cli.progress import Bars, bars
from blocktable.cli.warm import add_no_warm, background
from blocktable.plugin import CLASS_KINDS, KV_KINDS, V2_KINDS, attribute, replaces_slot_kernel
from blocktable.properties.report.report import render
from blocktable.properties.run import messages, parent
from blocktable.properties.run.calls import calls_text, never_called
from blocktable.properties.run.child import Target
from blocktable.properties.run.fuzz import fuzz_child
from blocktable.properties.run.messages import Job, Log, Message, Result, Stats
from blocktable.properties.run.stateless import kv_stateless_child, stateless_child, v2_stateless_child


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fuzz", help="fuzz a slot-mapping kernel and the block-table stack against the reference",
                       description=__doc__)
    add_kernel_and_device(p)
    add_kv_kernels(p)
    add_v2_kernels(p)
    add_classes(p)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--examples", type=int, metavar="N", help="lockstep examples to run (default: the profile's)")
    budget.add_argument("--minutes", type=float, metavar="M", help="fuzz for M minutes instead")
    p.add_argument("--seed", type=int, default=0, help="seed for the examples (default 0); same seed, same examples")
    p.add_argument("--profile", choices=["ci", "dev", "nightly"], default="ci",
                   help="Hypothesis profile: example sizes and program lengths (default ci)")
    p.add_argument("--out", type=Path, default=Path("blocktable-cases"),
                   help="folder for case files and the crash journal (default ./blocktable-cases)")
    p.add_argument("--stateless", action="store_true",
                   help="batched stateless fuzzing of the slot-mapping kernel alone, or with --kv-* or --v2-*, of "
                        "each KV or V2 block-table kernel named (see docs/cli.md)")
    p.add_argument("--max-tokens", type=int, metavar="T",
                   help="--stateless: the size slot-mapping batches are drawn for, 1 to T tokens (a batch of "
                        "many requests may hold up to 8 T, and 512 at least); default 4096 under the interpreter, "
                        "on a GPU 2**24 or less, so that every worker's largest batch fits in its memory")
    p.add_argument("--shrink-seconds", type=float, default=120, metavar="S",
                   help="when the kernel kills its process, spend up to S seconds replaying smaller "
                        "programs in fresh processes to shrink the crash (default 120; 0: keep it as found)")
    add_call_timeout(p)
    add_no_warm(p)
    p.add_argument("--verbose", action="store_true",
                   help="reports show the whole exception chain of a kernel that raised")
    p.add_argument("--strict-nan", action="store_true",
                   help="hold the KV outputs' NaN encodings exactly (by default an fp8 NaN may be either code and a "
                        "decoded NaN any NaN: docs/contract.md §9)")
    p.add_argument("--jobs", default="1", metavar="N|auto",
                   help="fuzzing processes at once, seeds SEED, SEED+1, ... (default 1; auto: the usable cores, "
                        "less one on a GPU host)")
    p.add_argument("--database", metavar="PATH|redis://HOST:PORT/N",
                   help="the Hypothesis example database every process reads first and saves failures to "
                        "(default: a folder under --out); a Redis password in the URL or in REDIS_PASSWORD, "
                        "never shown; see docs/fleet.md")
    p.add_argument("--database-readonly", action="store_true",
                   help="read --database without writing to it (pull-request runs); findings stay under --out")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UsageError as e:
        return usage_error("fuzz", str(e))
    except KeyboardInterrupt:
        return _interrupted(args)


def _interrupted(args: argparse.Namespace) -> int:
    """Ctrl-C: the children are stopped; the program each was running is kept as a case."""
    from blocktable.properties.run.interrupt import keep_journals

    try:
        kv = {kind: normalize_kv(kind, getattr(args, f"kv_{kind}")) for kind in KV_KINDS
              if getattr(args, f"kv_{kind}") is not None}
    except UsageError:
        kv = {}
    journals = sorted(args.out.glob("journal*.jsonl")) if args.out.is_dir() else []
    try:
        kept = keep_journals(journals, args.out, kv)
    except OSError as e:
        return interrupted("fuzz", f"the running program could not be kept: {e.strerror or e}")
    if not kept:
        return interrupted("fuzz", "nothing kept (no program to replay was running)")
    cases = ", ".join(map(str, kept))
    return interrupted("fuzz", f"kept the program that was running as {cases} (not confirmed; "
                               f"blocktable replay {kept[0]} runs it)")


def _check(args: argparse.Namespace) -> None:
    named = [f"--kv-{kind}" for kind in KV_KINDS if getattr(args, f"kv_{kind}", None) is not None]
    named_v2 = [f"--v2-{kind}" for kind in V2_KINDS if getattr(args, f"v2_{kind}", None) is not None]
    if args.examples is not None and args.examples < 1:
        raise UsageError(f"--examples must be >= 1, got {args.examples}")
    if args.minutes is not None and not (math.isfinite(args.minutes) and args.minutes > 0):
        raise UsageError(f"--minutes must be a number > 0, got {args.minutes}")
    if not (args.shrink_seconds >= 0 and math.isfinite(args.shrink_seconds)):
        raise UsageError(f"--shrink-seconds must be a number >= 0, got {args.shrink_seconds}")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.max_tokens is not None and (not args.stateless or named or named_v2):
        raise UsageError("--max-tokens sizes the batches of --stateless slot-mapping fuzzing: add --stateless "
                         "(without --kv-* or --v2-*), or drop it")
    if args.database_readonly and args.database is None:
        raise UsageError("--database-readonly needs --database: the shared database to read")
    if args.stateless and named and named_v2:
        raise UsageError(f"--stateless fuzzes the KV kernels or the V2 block-table kernels named, not both in one "
                         f"run: drop {named[0]} or the --v2-* flags")
    for kind in CLASS_KINDS:
        if args.stateless and getattr(args, attribute(kind), None) is not None:
            raise UsageError(f"--{kind} puts a class under the lockstep, which --stateless does not run: drop one "
                             f"of them")
    if getattr(args, "table", None) is not None and args.kernel != "triton":
        raise UsageError(f"--table puts a table class under test with its own compute_slot_mapping, so the lockstep "
                         f"calls no slot-mapping kernel: drop --kernel {args.kernel} (or put that kernel in the "
                         f"class)")
    if getattr(args, "table_v2", None) is not None and named_v2:
        raise UsageError(f"--table-v2 puts a V2 table class under test with its own kernels, so the lockstep calls "
                         f"no V2 kernel plug-in: drop {named_v2[0]} (or put that kernel in the class)")


def _jobs(args: argparse.Namespace) -> int:
    from blocktable.properties.run.workers import parse_jobs

    def gpu_host() -> bool:
        import torch

        return args.device != "cpu" and torch.cuda.is_available()

    try:
        return parse_jobs(args.jobs, gpu_host)
    except ValueError as e:
        raise UsageError(str(e)) from None


def _database(args: argparse.Namespace) -> str:
    """The --database to give the workers, checked (a Redis server must answer)."""
    from blocktable.properties.run.database import DEFAULT_FOLDER, check, check_reachable, is_redis

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
    from blocktable.properties.run import profiles
    from blocktable.properties.run.budget import Budget

    # --minutes: the whole command's limit, from now (run/budget.py).
    budget = Budget(time.monotonic(), 60 * args.minutes) if args.minutes else None
    _check(args)
    kernel = normalize_kernel(args.kernel)
    kv = {kind: normalize_kv(kind, getattr(args, f"kv_{kind}")) for kind in KV_KINDS
          if getattr(args, f"kv_{kind}") is not None}
    v2 = v2_specs(args)
    classes = class_specs(args)
    kv_text = "; ".join([f"kv-{kind} {spec}" for kind, spec in kv.items()]
                        + [f"v2-{kind} {spec}" for kind, spec in v2.items()]
                        + [f"{kind} {spec}" for kind, spec in classes.items()])
    # What the progress line and the summary name: the kernels under test (a table
    # class computes its own slot mappings, so with one no slot kernel is).
    alone = (args.stateless and (kv or v2)) or replaces_slot_kernel(classes)
    shown = kv_text if alone else "; ".join(filter(None, [kernel, kv_text]))
    jobs = _jobs(args)
    database = _database(args)
    examples = args.examples if args.examples is not None or args.minutes else profiles.MACHINE_BUDGET[args.profile][0]
    made = make_folder(args.out, "--out")
    journal = args.out / "journal.jsonl"
    job = Job(kernel, device=args.device, examples=examples, minutes=args.minutes, seed=args.seed,
              profile=args.profile, out=str(args.out), journal=str(journal), verbose=args.verbose,
              database=database, database_readonly=args.database_readonly, kv=kv, strict_nan=args.strict_nan, v2=v2,
              classes=classes, deadline=budget.deadline if budget else None,
              shrink_deadline=budget.shrink_until if budget else None, call_timeout=args.call_timeout or None,
              max_tokens=args.max_tokens)
    until = budget.end if budget else None
    target: Target
    if args.stateless and kv:  # the KV kernels named, each alone (run/stateless.py)
        target = kv_stateless_child
    elif args.stateless and v2:  # the V2 block-table kernels named, each alone
        target = v2_stateless_child
    elif args.stateless:
        target = stateless_child
    else:
        target = fuzz_child
    start = time.monotonic()
    workers = None
    if jobs > 1:
        from blocktable.cli import fuzz_workers

        with background(args, jobs, kv):
            workers = fuzz_workers.run(target, job, jobs, args.out, shown, _detail)
        result, latest = workers.result, workers.total
        if result is None:  # a worker died: its journal has the fatal step
            fuzz_workers.remove_journals(workers, keep=workers.ended_by)
            died = workers.ended_by or 0
            console.print(f"worker {died + 1} (seed {workers.jobs[died].seed}) died; the others were stopped")
            return _crashed(args, workers.jobs[died], Path(workers.jobs[died].journal or journal),
                            workers.outcomes[died].exitcode, until)
        fuzz_workers.remove_journals(workers)
    else:
        with background(args, jobs, kv):
            result, exitcode, latest = _run_one(args, shown, job, target, examples)
        if result is None:  # the child died: the journal has the fatal step
            return _crashed(args, job, journal, exitcode, until)
    _remove_journal(journal, args.out if made else None, keep_folder=result.status == "fail")
    if result.status == "config-error":
        return usage_error("fuzz", result.message)
    named = {**_under_test(args, kernel, kv, v2, replaces_slot_kernel(classes)), **classes}
    _summary(shown, args, latest, result, time.monotonic() - start, workers, named)
    if result.status == "pass" or result.failure is None:
        # A plug-in it never called was not checked: that run cannot pass.
        unit = "programs" if not args.stateless else "rounds" if kv or v2 else "batches"
        reason = never_called(named, latest.calls, latest.examples, unit)
        if reason is not None:
            return usage_error("fuzz", reason)
        console.print("[green]no discrepancy found[/]")
        return EXIT_PASS
    # A KV or V2 case names the plug-in it failed on: that is what replays it.
    failure = result.failure
    try:
        report = parent.confirm_and_save(failure, (failure.case_data or {}).get("kernel") or kernel, args.device,
                                         DISPLAY, until, job.call_timeout)
    except OSError as e:
        return usage_error("fuzz", f"cannot write the case file {failure.case}: {e.strerror or e}")
    if until is None or time.monotonic() < until:  # the triage replay is the first thing a time limit drops
        report.triage = parent.triage(failure, kernel, device.chooses_gpu(args.device))
    console.print(render(report), markup=False, soft_wrap=True)
    console.print(f"case file: {failure.case}", soft_wrap=True)
    return EXIT_FAIL


def _under_test(args: argparse.Namespace, kernel: str, kv: dict[str, str], v2: dict[str, str],
                table: bool = False) -> dict[str, str]:
    """The kernels this mode runs, by kind (run/calls.py): each must be called."""
    named = {} if (args.stateless and (kv or v2)) or table else {"kernel": kernel}
    return {**named, **{f"kv-{kind}": spec for kind, spec in kv.items()},
            **{f"v2-{kind}": spec for kind, spec in v2.items()}}


def _run_one(args: argparse.Namespace, kernel: str, job: Job, target: Target,
             examples: int) -> tuple[Result | None, int | None, Stats]:
    """One child behind one progress line: its result (None if it died), exit code
    and last stats."""
    from blocktable.properties.run.child import run_in_child

    latest = Stats()
    total = args.minutes * 60 if args.minutes else examples
    # The progress line starts with the child's first progress message, once the
    # device and the kernel are set up: a configuration error prints no line first.
    progress: Bars | None = None
    task: Any = None

    def on_message(message: Message) -> None:
        nonlocal latest, progress, task
        if isinstance(message, Log):
            console.print(message.text, markup=False)
            return
        if isinstance(message, messages.Progress):
            latest = message.stats
            if progress is None:
                progress = bars(console)
                task = progress.add(f"fuzz {kernel}", total)
            done = latest.elapsed if args.minutes else latest.examples
            progress.update(task, done, _detail(latest))

    try:
        outcome = run_in_child(target, job, on_message)
        result = outcome.result
        if result is not None:
            latest = result.stats or latest
        if result is not None and progress is not None:
            progress.update(task, total if result.status == "pass" else None, _detail(latest))
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


def _crashed(args: argparse.Namespace, job: Job, journal: Path, exitcode: int | None,
             until: float | None = None) -> int:
    """The child died mid-step: the crash's case, shrunk, confirmed and saved."""
    try:
        crash = parent.crashed(job, journal, exitcode, args.device, args.out, args.shrink_seconds, DISPLAY, until)
    except OSError as e:
        return usage_error("fuzz", f"cannot write the case file: {e.strerror or e}")
    if crash.report is None:  # a stateless batch: the message says how to repeat it
        console.print(crash.message, markup=False, soft_wrap=True)
        return EXIT_FAIL
    console.print(render(crash.report), markup=False, soft_wrap=True)
    console.print(f"case file: {crash.case}", soft_wrap=True)
    return EXIT_FAIL


def _detail(stats: Stats) -> str:
    seconds = max(stats.elapsed, 1e-9)
    if stats.tokens is not None:  # the stateless mode
        return f"{stats.batches} batches, {stats.tokens:,} tokens checked ({stats.tokens / seconds:,.0f}/s)"
    return (f"{stats.examples} programs ({stats.examples / seconds:.1f}/s), {stats.steps} checked steps, "
            f"{len(stats.events)} kinds of event reached")


def _summary(kernel: str, args: argparse.Namespace, stats: Stats, result: Result, elapsed: float,
             workers: Any = None, named: dict[str, str] | None = None) -> None:
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
        if stats.first_failure_s is not None and stats.examples_to_failure is not None:
            # Finding against shrinking: what a seed's time to a bug is, and what is left.
            table.add_row("first failing program", f"program {stats.examples_to_failure}, "
                          f"{stats.first_failure_s:.1f} s in; the rest is shrinking")
        events = stats.events
        table.add_row("events reached", ", ".join(f"{k} ×{v}" for k, v in sorted(events.items())) or "-")
    table.add_row("calls (shrinking included)", calls_text(stats.calls, named or {}))
    table.add_row("elapsed", f"{elapsed:.1f} s")
    table.add_row("result", "[green]pass[/]" if result.status == "pass" else "[red]discrepancy[/]")
    console.print(table)
    if workers is not None:
        from blocktable.cli.fuzz_workers import worker_table

        console.print(worker_table(workers))

