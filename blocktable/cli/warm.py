"""`blocktable warm`: compile into Triton's cache every variant of our kernels that a
lockstep fuzzing run can ask for (the slot-mapping kernel, the data oracle's, the V2
tables' and the KV kernels), with all the usable cores. A fuzzing run on a GPU then
loads each variant from the cache instead of compiling it on first use, about a
third of a second each on an H100 host (docs/results.md). `fuzz` warms the same way
in the background (unless --no-warm, or a warm before left its record in the cache);
run this once per host, Triton and blocktable version and kind of GPU before timing
runs against each other, or when building a runner's image (docs/cli.md).
`--stateless` warms, instead, what `fuzz --stateless --kv-…` draws of our KV kernels
(fuzz warms those in the background of such a run too). Exit 0:
every call made; 1: a call raised (each is named) or a process died; 2: usage error"""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from blocktable import device
from blocktable.cli.common import EXIT_FAIL, EXIT_PASS, console, usage_error
from blocktable.cli.progress import bars
from blocktable.device import CHOICES


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("warm", help="compile our kernels' variants that fuzzing needs into Triton's cache",
                       description=__doc__)
    p.add_argument("--device", default="auto", choices=CHOICES,
                   help="auto (the GPU if present), cuda, or cpu (the interpreter: nothing to compile)")
    p.add_argument("--processes", type=int, metavar="P",
                   help="processes compiling at once (default: one per usable core)")
    p.add_argument("--stateless", action="store_true",
                   help="instead, the variants of our KV kernels that `fuzz --stateless --kv-…` draws (752 tiny "
                        "calls)")
    p.set_defaults(run=run)


def add_no_warm(p: argparse.ArgumentParser) -> None:
    """fuzz's switch for the background warm."""
    p.add_argument("--no-warm", action="store_true",
                   help="on a GPU, do not compile our kernels' variants ahead in the background "
                        "(see `blocktable warm`)")


def run(args: argparse.Namespace) -> int:
    import torch

    from blocktable.properties.run import warmed
    from blocktable.properties.run.warm import family_calls, warm
    from blocktable.properties.run.workers import usable_cores

    if args.processes is not None and args.processes < 1:
        return usage_error("warm", f"--processes must be >= 1, got {args.processes}")
    if args.device == "cuda" and not torch.cuda.is_available():
        return usage_error("warm", "--device cuda was asked for, but torch sees no CUDA GPU")
    if not device.chooses_gpu(args.device):
        console.print("nothing to compile: under the Triton interpreter (no GPU, or --device cpu) no kernel is "
                      "compiled")
        return EXIT_PASS
    processes = args.processes or len(usable_cores())
    family = "stateless-kv" if args.stateless else "lockstep"
    progress = bars(console)
    task = progress.add("warm", len(family_calls(family)))
    finished = 0

    def on_call(what: str, error: str | None) -> None:
        nonlocal finished
        finished += 1
        progress.update(task, finished, what if error is None else f"{what}: raised")

    try:
        report = warm("cuda", processes, on_call, family)
    finally:
        progress.stop()
    for what, error in report.failed:
        console.print(f"[red]raised[/] in {what}: {error}", soft_wrap=True)
    missing = report.total - report.done - len(report.failed)
    if report.died:
        console.print(f"[red]{len(report.died)} process(es) died[/] (exit codes {report.died}); "
                      f"{missing} calls not made")
    cache = warmed.cache_folder() or "Triton's cache folder"
    console.print(f"{report.done} of {report.total} warm calls made in {report.seconds:.1f} s on "
                  f"{processes} process(es); cache: {cache}", soft_wrap=True)
    return EXIT_PASS if report.done == report.total else EXIT_FAIL


def background(args: argparse.Namespace, jobs: int, kv: dict[str, str]) -> AbstractContextManager[Any]:
    """fuzz's background warm on a GPU: for a lockstep run (every one launches our
    data oracle's kernels, whatever it plugs in), or a stateless run of the KV
    kernels where one of them (`kv`: the --kv-* named) is ours; unless a warm before
    left its record that the cache holds every variant (run/warmed.py). As many
    processes as the cores the fuzzing processes leave (one at least, at low
    priority)."""
    from blocktable.properties.run import warmed
    from blocktable.properties.run.warm import MAX_BACKGROUND, in_background
    from blocktable.properties.run.workers import usable_cores

    if args.no_warm or not device.chooses_gpu(args.device):
        return nullcontext()
    if args.stateless and "triton" not in kv.values():  # the slot or V2 kernels, or KV plug-ins alone: no warm
        return nullcontext()
    family = "stateless-kv" if args.stateless else "lockstep"
    record = warmed.key(family)  # hashes the package's modules: once, for the check and the processes
    if warmed.is_warm(record):  # a warm before left every variant in the cache
        return nullcontext()
    return in_background("cuda", min(MAX_BACKGROUND, max(1, len(usable_cores()) - jobs)), record, family)
