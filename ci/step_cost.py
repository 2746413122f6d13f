"""The cost of a checked lockstep step with every kernel compiled: one process runs the
same seeded programs (`--examples N`) twice, the first pass compiling what Triton needs
and the second timed. A minute of `blocktable fuzz` on a fresh machine also pays
Triton's compilations on first use, and a faster run reaches programs (and kernel
variants) that a slower one never meets, so only the same programs, run again, give
the step's own cost. Compare settings by running this once for each, on one host:

    BLOCKTABLE_KV_WORLDS=0 python ci/step_cost.py --examples 120
    BLOCKTABLE_KV_WORLDS=1 python ci/step_cost.py --examples 120

`--profile N` runs a third pass of the same programs under cProfile and prints where
its time went: own time by part (our lockstep code, the implementation, the
reference, Hypothesis, torch, Triton, numpy) and the N functions with the most own
time. cProfile slows pure Python more than native calls, so the shares are rough.
`--sample N` runs the third pass under a stack sampler instead (ci/stack_sampler.py),
which slows no call: the wall time by part of the innermost Python frame (a native
call, a wait for the device included, is charged to its caller), and the N functions
on the stack most often, with what they call.

`--device cpu --kernel reference` times the harness's own host work without a GPU:
the reference's slot mapping stands in for the interpreted kernel, and the KV, V2 and
oracle kernels are the torch-native ones the interpreter runs by default. On a GPU a
step's time is mostly this host work (the kernels are launched, not waited on), so
the figure moves with it, though torch's CPU operations cost more than launches.

Needs the package installed (`pip install -e .`).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time

from stack_sampler import Samples, sampling

from blocktable.properties.run.fuzz import fuzz_child
from blocktable.properties.run.messages import Job, Message, Result, Stats


def run(job: Job) -> tuple[Stats, float, float]:
    """One fuzzing child in this process: its statistics, its wall time and this
    process's CPU time meanwhile. Stops with an error unless it passed (a failing
    run's time is no step's cost)."""
    results: list[Result] = []

    def keep(message: Message) -> None:
        if isinstance(message, Result):
            results.append(message)

    start, cpu = time.perf_counter(), time.process_time()
    fuzz_child(job, keep)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    result = results[-1]
    if result.status != "pass" or result.stats is None:
        sys.exit(f"the run did not pass ({result.status}): time a passing run")
    return result.stats, elapsed, cpu


def one_pass(examples: int, seed: int, device: str, folder: str, kernel: str = "triton") -> tuple[Stats, float, float]:
    return run(Job(kernel, device=device, seed=seed, examples=examples, out=folder,
                   journal=os.path.join(folder, "journal.jsonl")))


def parts_by_folder() -> list[tuple[str, str]]:
    """(folder, part) for our four packages, wherever they are installed (a checkout's
    editable install keeps them in four top-level folders), the deepest first."""
    import blocktable
    import blocktable.kernels
    import blocktable.properties
    import blocktable.reference

    ours = [(blocktable.properties, "our lockstep code (properties)"), (blocktable.reference, "the reference"),
            (blocktable.kernels, "our kernels' Python"), (blocktable, "the implementation (blocktable)")]
    return [(os.path.join(os.path.dirname(os.path.abspath(package.__file__)), ""), name) for package, name in ours]


LIBRARIES = (("/hypothesis/", "Hypothesis"), ("/triton/", "Triton"), ("/torch/", "torch"), ("/numpy/", "numpy"))


def part(filename: str, function: str, folders: list[tuple[str, str]]) -> str:
    """Which part of the process a profiled function belongs to (a built-in method by
    its name: torch's and numpy's C methods name their type)."""
    for folder, name in folders:
        if filename.startswith(folder):
            return name
    for marker, name in LIBRARIES:
        if marker in filename:
            return name
    for word, name in (("torch", "torch"), ("TensorBase", "torch"), ("numpy", "numpy"), ("triton", "Triton")):
        if word in function:
            return name
    return "other (Python, built-ins)"


def profile(examples: int, seed: int, device: str, folder: str, top: int, save: str | None,
            kernel: str = "triton") -> str:
    """A third pass under cProfile: own time by part, then the `top` functions; the
    whole profile written to `save` too (pstats' format), when given."""
    profiler = cProfile.Profile()
    profiler.enable()
    stats, elapsed, _ = one_pass(examples, seed, device, folder, kernel)
    profiler.disable()
    if save:
        profiler.dump_stats(save)
    table = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    folders = parts_by_folder()
    parts: collections.Counter[str] = collections.Counter()
    for (filename, _, function), (_, _, own, _, _) in table.items():
        parts[part(filename, function, folders)] += own
    total = sum(parts.values())
    out = io.StringIO()
    out.write(f"profiled pass: {stats.steps} checked steps in {elapsed:.1f} s under cProfile; own time by part:\n")
    for name, seconds in parts.most_common():
        out.write(f"  {seconds:7.2f} s {100 * seconds / total:5.1f}%  {name}\n")
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def sample(examples: int, seed: int, device: str, folder: str, top: int, kernel: str = "triton") -> str:
    """A third pass under the stack sampler: wall time by part of the innermost frame,
    then the `top` functions by samples with them on the stack (those on nearly every
    stack, the callers of the whole pass, left out)."""
    with sampling() as samples:
        stats, elapsed, _ = one_pass(examples, seed, device, folder, kernel)
    return describe_samples(samples, stats.steps, elapsed, top)


def describe_samples(samples: Samples, steps: int, elapsed: float, top: int) -> str:
    folders = parts_by_folder()
    total = max(sum(samples.seconds), 1e-9)
    per_step = 1000 / max(1, steps)
    out = io.StringIO()
    out.write(f"sampled pass: {steps} checked steps in {elapsed:.1f} s, {len(samples.stacks)} samples "
              f"standing for {total:.1f} s; wall time by part of the innermost Python frame:\n")
    for name, seconds in samples.own(lambda frame: part(frame[0], frame[1], folders)).most_common():
        out.write(f"  {seconds:7.2f} s {100 * seconds / total:5.1f}%  {name}\n")
    out.write("functions by the time they were on the stack, with what they call (ms a checked step):\n")
    shown = 0
    for (filename, function, line), seconds in samples.inclusive().most_common():
        if seconds > 0.98 * total:  # the callers of the whole pass
            continue
        out.write(f"  {100 * seconds / total:5.1f}% {per_step * seconds:6.3f}  {function} ({filename}:{line})\n")
        shown += 1
        if shown == top:
            break
    out.write("lines of our code by time, a library's time charged to the line calling it "
              "(ms a checked step):\n")
    ours = tuple(folder for folder, _ in folders)
    for (filename, function, _, line), seconds in samples.lines(lambda f: f[0].startswith(ours)).most_common(top):
        out.write(f"  {100 * seconds / total:5.1f}% {per_step * seconds:6.3f}  {filename}:{line} ({function})\n")
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=120, help="programs per pass (default 120)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--kernel", default="triton",
                        help="the slot-mapping kernel: ours (triton, the default) or reference (the numpy one)")
    parser.add_argument("--profile", type=int, metavar="N", default=0,
                        help="a third pass under cProfile: own time by part and the N costliest functions")
    parser.add_argument("--sample", type=int, metavar="N", default=0,
                        help="a third pass under a stack sampler: wall time by part and the N functions most "
                             "often on the stack")
    parser.add_argument("--save", metavar="FILE", help="with --profile: the whole profile, in pstats' format, "
                                                       "for `python -m pstats FILE`")
    args = parser.parse_args()
    setting = {name: os.environ[name] for name in sorted(os.environ) if name.startswith("BLOCKTABLE_")}
    with tempfile.TemporaryDirectory() as folder:
        warm, warm_s, _ = one_pass(args.examples, args.seed, args.device, folder, args.kernel)
        timed, timed_s, timed_cpu = one_pass(args.examples, args.seed, args.device, folder, args.kernel)
        profiled = ""
        if args.profile:
            profiled = profile(args.examples, args.seed, args.device, folder, args.profile, args.save, args.kernel)
        if args.sample:
            profiled += sample(args.examples, args.seed, args.device, folder, args.sample, args.kernel)
    if timed.steps != warm.steps:
        sys.exit(f"the passes ran different programs ({warm.steps} and {timed.steps} steps): not comparable")
    kernel = "" if args.kernel == "triton" else f", slot kernel {args.kernel}"
    print(f"{setting or 'defaults'}{kernel}: {timed.steps} checked steps a pass; compiling pass {warm_s:.1f} s, "
          f"timed pass {timed_s:.1f} s = {timed.steps / timed_s:.1f} checked steps/s "
          f"({1000 * timed_s / timed.steps:.2f} ms a step); this process's CPU time {timed_cpu:.1f} s, "
          f"{100 * timed_cpu / timed_s:.0f}% of the wall time (a wait that spins counts as CPU time; "
          f"BLOCKTABLE_BLOCKING_SYNC=1 makes the waits sleep)")
    if profiled:
        print(profiled, end="")


if __name__ == "__main__":
    main()
