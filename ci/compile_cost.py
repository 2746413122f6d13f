"""Where a fuzzing run's first minutes go: one `blocktable fuzz` child in this process
for `--seconds`, with Triton's work on each kernel variant's first use timed. A
variant's first launch in a process goes through `JITFunction._do_compile`, which
compiles it or loads it from Triton's disk cache; a real compilation also runs the
front end (`ASTSource.make_ir`), once; a new argument signature builds a launcher with
the C compiler. It also names the kernels really compiled (not found in the disk
cache), with a count for each, from Triton's compilation listener: after `blocktable
warm`, a run should compile none of ours. Run it with an empty cache and again with
the cache it left:

    TRITON_CACHE_DIR=/tmp/tc python ci/compile_cost.py --seconds 40
    TRITON_CACHE_DIR=/tmp/tc BLOCKTABLE_KV_WORLDS=0 python ci/compile_cost.py --seconds 40

The hooks are Triton's internals (read from Triton 3.6); one a Triton version lacks is
reported as not timed. Under the interpreter nothing compiles. Needs the package
installed (`pip install -e .`).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from step_cost import run  # this folder: python puts a script's own folder first on sys.path

from blocktable.properties.run.messages import Job

# (module, owner in it or "", attribute, what the report calls it)
HOOKS = (("triton.runtime.jit", "JITFunction", "_do_compile", "first uses"),
         ("triton.compiler.compiler", "ASTSource", "make_ir", "compilations"),
         ("triton.backends.nvidia.driver", "", "compile_module_from_src", "launcher loads and builds"))


def timed(owner: Any, name: str, label: str, seconds: dict[str, float], calls: collections.Counter[str]) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds[label] += time.perf_counter() - start
            calls[label] += 1

    setattr(owner, name, wrapper)


def listen(compiled: collections.Counter[str]) -> bool:
    """Count each kernel Triton really compiles (a cache miss) by name; False where
    this Triton has no compilation listener."""
    import triton

    knobs = getattr(getattr(triton, "knobs", None), "compilation", None)
    if knobs is None or not hasattr(knobs, "listener"):
        return False

    def heard(*, src: Any, cache_hit: bool, **_: Any) -> None:
        if not cache_hit:
            compiled[getattr(src, "name", "?")] += 1

    knobs.listener = heard
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, default=40.0, help="how long to fuzz (default 40)")
    budget.add_argument("--examples", type=int, help="fuzz this many programs instead")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    setting = {name: os.environ[name] for name in sorted(os.environ) if name.startswith("BLOCKTABLE_")}
    seconds: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    untimed = []
    # Under the interpreter nothing compiles, and its patches of Triton's modules
    # must be the first (blocktable/interpreter.py): no hook.
    for module, owner, name, label in HOOKS if args.device == "cuda" else ():
        try:
            target = importlib.import_module(module)
            target = getattr(target, owner) if owner else target
            getattr(target, name)
        except (ImportError, AttributeError):
            untimed.append(label)
            continue
        timed(target, name, label, seconds, calls)
    compiled: collections.Counter[str] = collections.Counter()
    heard = args.device == "cuda" and listen(compiled)
    with tempfile.TemporaryDirectory() as folder:
        limit = dict(examples=args.examples) if args.examples else dict(
            minutes=args.seconds / 60, deadline=time.monotonic() + args.seconds)
        stats, elapsed, _ = run(Job("triton", device=args.device, seed=args.seed, out=folder,
                                 journal=os.path.join(folder, "journal.jsonl"), **limit))
    parts = [f"{label} {calls[label]} in {seconds[label]:.1f} s" for _, _, _, label in HOOKS if label not in untimed]
    parts += [f"{label} not timed" for label in untimed]
    if heard:
        names = ", ".join(f"{name} {count}" for name, count in compiled.most_common())
        parts.append(f"compiled: {names or 'none'}")
    if args.device != "cuda":
        parts = ["the interpreter compiles nothing"]
    print(f"{setting or 'defaults'}: {stats.steps} checked steps in {elapsed:.1f} s = "
          f"{stats.steps / elapsed:.1f}/s; " + "; ".join(parts))


if __name__ == "__main__":
    main()
