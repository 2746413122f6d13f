"""What a checked lockstep step asks of torch and the device, counted: the torch
operations it dispatches, the Triton kernels it launches and (on a GPU) the calls
that wait for the device, each by the line of our code that made it, per checked
step. On a GPU the host's share of a step is mostly these: each dispatch costs some
microseconds of the host's time and each wait idles it. The counts, unlike a timing,
are the same on any machine for the same programs, so a change that cuts them can be
shown on the CPU (there, with our Triton kernels interpreted in place of the
torch-native ones the interpreter runs by default, a GPU's launches are counted too):

    BLOCKTABLE_KV_KERNELS=triton BLOCKTABLE_V2_KERNELS=triton BLOCKTABLE_ORACLE=triton \\
        python ci/step_ops.py --examples 20 --device cpu
    python ci/step_ops.py --examples 200 --top 40        # on a GPU: the waits too

Like `ci/step_cost.py`, one process runs the same seeded programs twice; the first
pass compiles what Triton needs and the second is counted. A torch operation made
inside a torch-native kernel (ours under the interpreter: the KV, V2 and oracle
engines), the reference's slot mapping or Triton's interpreter is counted apart: on
a GPU each of those is one Triton launch instead.

Needs the package installed (`pip install -e .`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_cost  # noqa: E402  (a script beside this one, not a package)

# Code that stands for one kernel launch on a GPU: its torch operations are counted
# apart (file suffix, and the function's qualified name where only some of a file's do).
KERNEL_CODE = (("blocktable/kv_torch.py", ""), ("blocktable/v2_torch.py", ""), ("blocktable/oracle.py", "TorchEngine."),
               ("properties/slot/truth.py", "reference_slot_mapping"), ("reference/", ""))
INSIDE_KERNELS = "inside torch-native kernels, the reference's slot mapping or Triton's interpreter"
OUTSIDE = "outside our code"
SYNC_WARNING = "called a synchronizing CUDA operation"  # what torch's sync debug mode says


class Sites:
    """Names the innermost frame of our code on the stack, as `package/file.py:line
    function`."""

    def __init__(self) -> None:
        self.roots = [folder for folder, _ in step_cost.parts_by_folder()]

    def ours(self, filename: str) -> str | None:
        for root in self.roots:
            if filename.startswith(root):
                return os.path.join(os.path.basename(os.path.dirname(root)), filename[len(root):])
        return None

    def of(self, frame: FrameType | None, launch: bool = False) -> str:
        """The innermost frame of ours, unless some frame on the stack is kernel code
        (KERNEL_CODE, or Triton's interpreter running a kernel: INSIDE_KERNELS). For
        a `launch`, Triton's own frames between it and our code are passed over."""
        site = None
        while frame is not None:
            code = frame.f_code
            name = self.ours(code.co_filename)
            if name is not None:
                if kernel_code(name, qualified_name(frame)):
                    return INSIDE_KERNELS
                site = site or f"{name}:{frame.f_lineno} {code.co_name}"
            elif "/triton/" in code.co_filename and not launch and site is None:
                return INSIDE_KERNELS
            frame = frame.f_back
        return site or OUTSIDE


def qualified_name(frame: FrameType) -> str:
    """The function's qualified name ("TorchEngine.gather"); before Python 3.11, which
    keeps it on the code object, from the class of its `self`."""
    code = frame.f_code
    if hasattr(code, "co_qualname"):
        return str(code.co_qualname)
    owner = frame.f_locals.get("self")
    return f"{type(owner).__name__}.{code.co_name}" if owner is not None else code.co_name


def kernel_code(name: str, qualified_name: str) -> bool:
    """Whether a function of ours stands for a kernel launch (KERNEL_CODE)."""
    for path, qualified in KERNEL_CODE:
        inside = name.startswith(path) if path.endswith("/") else name.endswith(path)
        if inside and qualified_name.startswith(qualified):
            return True
    return False


class Counts:
    """Counts by (call site, what)."""

    def __init__(self) -> None:
        self.by: collections.Counter[tuple[str, str]] = collections.Counter()

    def add(self, site: str, what: str) -> None:
        self.by[site, what] += 1

    def total(self, keep: Any = lambda site: True) -> int:
        return sum(n for (site, _), n in self.by.items() if keep(site))

    def table(self, steps: int, top: int, keep: Any = lambda site: True) -> str:
        sites: collections.Counter[str] = collections.Counter()
        for (site, _), n in self.by.items():
            if keep(site):
                sites[site] += n
        lines = []
        for site, n in sites.most_common(top):
            what = sorted(((m, w) for (s, w), m in self.by.items() if s == site), reverse=True)[:4]
            kinds = ", ".join(f"{w} {m / steps:.2f}" for m, w in what)
            lines.append(f"  {n / steps:7.2f}  {site}  [{kinds}]")
        return "\n".join(lines)


class DispatchCounter(TorchDispatchMode):
    """Every torch operation that reaches the dispatcher, by our call site."""

    def __init__(self, sites: Sites, counts: Counts) -> None:
        super().__init__()
        self.sites, self.counts = sites, counts

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.counts.add(self.sites.of(sys._getframe(1)), str(func).removeprefix("aten."))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting_launches(sites: Sites, counts: Counts) -> Iterator[None]:
    """Every Triton launch (compiled or interpreted), by kernel name and call site."""
    from triton.runtime import interpreter, jit

    classes = [jit.JITFunction, interpreter.InterpretedFunction]
    originals = [cls.run for cls in classes]

    def wrap(original: Any) -> Any:
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("warmup"):
                name = getattr(self, "__name__", None) or getattr(getattr(self, "fn", None), "__name__", "kernel")
                counts.add(sites.of(sys._getframe(1), launch=True), name)
            return original(self, *args, **kwargs)
        return counted

    for cls, original in zip(classes, originals):
        cls.run = wrap(original)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, original in zip(classes, originals):
            cls.run = original  # type: ignore[method-assign]


@contextlib.contextmanager
def counting_waits(sites: Sites, counts: Counts) -> Iterator[None]:
    """On a GPU, every call that waits for the device: those torch's sync debug mode
    warns of (a copy to the host, `.item()`, a data-dependent shape), and explicit
    event and device synchronizations (each call counted, also when the event is long
    done: a count of calls that may wait, not of time waited)."""
    shown = warnings.showwarning
    event_sync, device_sync = torch.cuda.Event.synchronize, torch.cuda.synchronize
    mode = torch.cuda.get_sync_debug_mode()

    def show(message: Any, category: Any, *rest: Any, **kwargs: Any) -> None:
        if SYNC_WARNING in str(message):
            counts.add(sites.of(sys._getframe(1)), "implicit (sync debug mode)")
        else:
            shown(message, category, *rest, **kwargs)

    def on_event(self: Any) -> None:
        counts.add(sites.of(sys._getframe(1)), "Event.synchronize")
        event_sync(self)

    def on_device(*args: Any, **kwargs: Any) -> None:
        counts.add(sites.of(sys._getframe(1)), "torch.cuda.synchronize")
        device_sync(*args, **kwargs)

    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=f".*{SYNC_WARNING}")  # each one, not once a line
        warnings.showwarning = show
        torch.cuda.Event.synchronize = on_event  # type: ignore[method-assign]
        torch.cuda.synchronize = on_device
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(mode)
            torch.cuda.Event.synchronize = event_sync  # type: ignore[method-assign]
            torch.cuda.synchronize = device_sync
            warnings.showwarning = shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=40, help="programs per pass (default 40)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--kernel", default="triton", help="the slot-mapping kernel (default ours, triton)")
    parser.add_argument("--top", type=int, default=25, help="call sites listed per table (default 25)")
    args = parser.parse_args()
    setting = {name: os.environ[name] for name in sorted(os.environ) if name.startswith("BLOCKTABLE_")}
    sites, ops, launches, waits = Sites(), Counts(), Counts(), Counts()
    with tempfile.TemporaryDirectory() as folder:
        def one_pass() -> Any:
            return step_cost.one_pass(args.examples, args.seed, args.device, folder, args.kernel)[0]

        warm = one_pass()
        with contextlib.ExitStack() as stack:
            stack.enter_context(counting_launches(sites, launches))
            if args.device == "cuda":
                stack.enter_context(counting_waits(sites, waits))
            stack.enter_context(DispatchCounter(sites, ops))
            counted = one_pass()
    if counted.steps != warm.steps:
        sys.exit(f"the passes ran different programs ({warm.steps} and {counted.steps} steps): not comparable")
    steps = counted.steps
    if not steps:
        sys.exit("no checked step in the counted pass: give it more --examples")

    def ours(site: str) -> bool:
        return site not in (INSIDE_KERNELS, OUTSIDE)

    waited = f"{waits.total() / steps:.2f} waits for the device" if args.device == "cuda" else \
        "waits for the device not counted (on the CPU nothing waits)"
    print(f"{setting or 'defaults'}, slot kernel {args.kernel}, {args.device}: {steps} checked steps counted; "
          f"per checked step {ops.total(ours) / steps:.1f} torch operations dispatched by our code "
          f"({ops.total(lambda site: site == INSIDE_KERNELS) / steps:.1f} more {INSIDE_KERNELS}, "
          f"{ops.total(lambda site: site == OUTSIDE) / steps:.1f} {OUTSIDE}), "
          f"{launches.total() / steps:.2f} Triton launches, {waited}")
    print(f"torch operations per checked step, by call site:\n{ops.table(steps, args.top, ours)}")
    print(f"Triton launches per checked step, by call site:\n{launches.table(steps, args.top)}")
    if args.device == "cuda":
        print(f"waits for the device per checked step, by call site:\n{waits.table(steps, args.top)}")


if __name__ == "__main__":
    main()
