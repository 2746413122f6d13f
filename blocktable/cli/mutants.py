"""`blocktable mutants`: apply each catalogued mutant to a copy of the source, fuzz
it with the ci profile, and show which the harness kills. Exit 0 only if every
non-equivalent mutant is killed; 2 on a usage error."""

from __future__ import annotations

import argparse
import json
import math
import statistics
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from queue import Queue

from rich.table import Table

from blocktable.cli.common import EXIT_FAIL, EXIT_PASS, console, errors, usage_error
from blocktable.cli.progress import bars
from blocktable.device import CHOICES
from blocktable.properties.report.describe import label_poison
from blocktable.properties.run.workers import Placement, parse_jobs, placements, visible_gpus

TICK_SECONDS = 1.0  # how often the gate looks at the time while no mutant finishes (the interval decides)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mutants", help="the mutation gate: does the harness kill every catalogued bug?",
                       description=__doc__)
    p.add_argument("--only", nargs="+", metavar="ID", help="run only these mutants (ids, or a layer name)")
    p.add_argument("--budget", type=float, default=120.0, metavar="SECONDS",
                   help="fuzzing time per mutant before it counts as surviving (default 120)")
    p.add_argument("--jobs", default="auto", metavar="N|auto",
                   help="mutants run at once, one single-threaded process each (default auto: the usable cores, "
                        "less one on a GPU host)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", choices=CHOICES)
    p.add_argument("--include-equivalent", action="store_true", help="also run the mutants marked equivalent")
    output = p.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the verdicts as JSON instead of a table")
    output.add_argument("--markdown", action="store_true", help="print the verdicts as a Markdown table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from blocktable.properties.mutation.catalogue import CATALOGUE
    from blocktable.properties.mutation.run import Verdict, run_mutant

    chosen = list(CATALOGUE)
    if args.only:
        known = {m.id for m in CATALOGUE} | {m.layer for m in CATALOGUE}
        unknown = [x for x in args.only if x not in known]
        if unknown:
            return usage_error("mutants", f"unknown mutant or layer {', '.join(unknown)} (ids such as "
                                          f"{CATALOGUE[0].id}, or a layer: "
                                          f"{', '.join(sorted({m.layer for m in CATALOGUE}))})")
        chosen = [m for m in CATALOGUE if m.id in args.only or m.layer in args.only]
    if not (args.budget > 0 and math.isfinite(args.budget)):
        return usage_error("mutants", f"--budget must be a number of seconds > 0, got {args.budget}")
    try:
        jobs = parse_jobs(args.jobs, lambda: args.device != "cpu" and _cuda())
    except ValueError as e:
        return usage_error("mutants", str(e))
    # The fuzz workers' placement: one thread per library, a core each while there
    # are no more mutants at once than cores, the GPUs in turn. A mutant runs where
    # a slot is free; its slot's placement goes with it.
    slots: Queue[Placement] = Queue()
    for place in placements(jobs, visible_gpus(args.device)):
        slots.put(place)

    def run_placed(mutant):
        place = slots.get()
        try:
            return run_mutant(mutant, args.budget, args.seed, args.device, place)
        finally:
            slots.put(place)
    hardware = workers_convert_fp8_in_hardware(args.device)
    to_run = [m for m in chosen if (args.include_equivalent or not m.equivalent) and not m.unreached(hardware)]
    verdicts: dict[str, Verdict] = {m.id: Verdict(m.id, m.layer, m.imitates, None, equivalent=m.equivalent,
                                                  unreached=m.unreached(hardware))
                                    for m in chosen if m not in to_run}
    # On a terminal rich's live bar; in a log (CI) a line when the gate starts, one per
    # verdict and one every BLOCKTABLE_PROGRESS_SECONDS while mutants run, so that a
    # long gate shows life. Beside --json or --markdown, which own stdout, on stderr:
    # a nightly's `mutants --json > FILE` runs for hours, and a gate stopped by a time
    # limit has printed no table, so its log holds the verdicts it reached.
    shown = bars(errors if args.json or args.markdown else console)
    task = shown.add("mutants", len(to_run))
    done: list[Verdict] = []
    try:
        shown.update(task, 0, progress_text(done, len(to_run)))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(run_placed, m): m for m in to_run}
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=TICK_SECONDS, return_when=FIRST_COMPLETED)
                for future in sorted(finished, key=lambda f: to_run.index(futures[f])):  # a fixed order
                    verdict = future.result()
                    verdicts[verdict.id] = verdict
                    done.append(verdict)
                    shown.update(task, len(done), progress_text(done, len(to_run)), event=True)
                if not finished:  # nothing new: the interval decides
                    shown.update(task, len(done), progress_text(done, len(to_run)))
    finally:
        shown.stop()
    ordered = [verdicts[m.id] for m in chosen]
    survivors = [v for v in ordered if v.killed is False and not v.equivalent]
    if args.json:
        print(json.dumps([v.to_json() for v in ordered], indent=1))
    elif args.markdown:
        print(markdown_table(ordered))
    else:
        console.print(verdict_table(ordered), soft_wrap=True)
        console.print(summary_line(ordered))
    return EXIT_FAIL if survivors else EXIT_PASS


def progress_text(done: list, total: int) -> str:
    """`2/40 run, 2 killed; T07 killed in 12.5 s`: the count so far and the last verdict."""
    killed = sum(1 for v in done if v.killed)
    text = f"{len(done)}/{total} run, {killed} killed"
    if not done:
        return text
    last = done[-1]
    if not last.killed:
        return f"{text}; {last.id} SURVIVED"
    after = f" in {last.seconds_to_kill:.1f} s" if last.seconds_to_kill is not None else ""
    return f"{text}; {last.id} killed{after}"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def workers_convert_fp8_in_hardware(device: str) -> bool:
    """Whether the fuzz workers' fp8 write will use the GPU's conversion (which
    decides the fp8 mutants they can reach)."""
    from blocktable.device import chooses_gpu

    if not chooses_gpu(device):
        return False
    import torch

    from blocktable.kv import converts_fp8

    return converts_fp8(torch.device("cuda", torch.cuda.current_device()))


def _kill_cells(v) -> tuple[str, str, str]:
    """(time to kill, examples, shrunk steps) as both tables show them."""
    seconds = f"{v.seconds_to_kill:.1f} s" if v.seconds_to_kill is not None else "-"
    examples = "spec example" if v.examples_to_kill == 0 else str(v.examples_to_kill or "-")
    return seconds, examples, str(v.shrunk_steps or "-")


def verdict_table(verdicts: list) -> Table:
    table = Table(title="blocktable mutation gate")
    for column in ("mutant", "layer", "killed?", "time to kill", "examples", "shrunk steps", "imitates / detected by"):
        table.add_column(column)
    for v in verdicts:
        if v.killed is None:
            killed, detail = ("not reached", v.unreached) if v.unreached else ("equivalent", v.equivalent or "")
        else:
            killed = "[green]killed[/]" if v.killed else "[red]SURVIVED[/]"
            detail = f"{v.imitates}" + (f"\n↳ {label_poison(v.by)}" if v.by else "")
        table.add_row(v.id, v.layer, killed, *_kill_cells(v), detail)
    return table


def summary_line(verdicts: list) -> str:
    ran = [v for v in verdicts if v.killed is not None and not v.equivalent]
    killed = [v for v in ran if v.killed]
    times = [v.seconds_to_kill for v in killed if v.seconds_to_kill is not None]
    text = f"{len(killed)}/{len(ran)} non-equivalent mutants killed"
    if times:
        text += f"; time to kill: median {statistics.median(times):.1f} s, worst {max(times):.1f} s"
    equivalent = sum(1 for v in verdicts if v.equivalent)
    unreached = sum(1 for v in verdicts if v.killed is None and v.unreached and not v.equivalent)
    return (text + (f"; {equivalent} marked equivalent" if equivalent else "")
            + (f"; {unreached} not reached on this backend" if unreached else ""))


def markdown_table(verdicts: list) -> str:
    lines = ["| mutant | layer | imitates | killed? | time to kill | examples | shrunk steps |",
             "| --- | --- | --- | --- | ---: | ---: | ---: |"]
    for v in verdicts:
        if v.killed is None:
            killed = "not reached" if v.unreached else "equivalent"
        else:
            killed = "killed" if v.killed else "**SURVIVED**"
        seconds, examples, shrunk = _kill_cells(v)
        why = (v.unreached or v.equivalent) if v.killed is None else None
        imitates = v.imitates + (f" ({why})" if why else "")
        lines.append(f"| {v.id} | {v.layer} | {imitates} | {killed} | {seconds} | {examples} | {shrunk} |")
    return "\n".join(lines) + "\n\n" + summary_line(verdicts)
