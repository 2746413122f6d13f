"""Timing vLLM's V2 block tables (docs/contract.md §10): the three device operations
(append the staged writes, gather rows into batch order, the slot mappings of every
group), ours (Triton, blocktable.v2) beside the torch-native twins
(blocktable.v2_torch) and any plug-in of each kind, on the steps of a serving engine
(blocktable.cli.bench_v2_step): decode batches of 256 and 1,024 requests with one and
four groups, a mixed prefill/decode batch, a long prefill and 1,024 requests at a
2,048-token context.

Each operation is first run by every implementation from the same buffers, and every
buffer it writes (all groups' rows and the counts, all of `inp`, the whole `slots`)
compared with ours bit for bit: one that differs, or raises, is reported and not
timed. Times are medians of CUDA-graph replays where the call can be captured, and of
plain launches (CUDA events) where it cannot; each row says which. Bandwidth counts
the bytes a call must move at least.

The slot mappings of four groups are also timed as four calls of one group each, the
design vLLM's one launch replaces; those calls' output is checked equal to the one
launch's first.

Under the interpreter the same code runs on tiny steps: it checks the path, and its
wall times are not timings. `blocktable bench --suite v2` runs it (`--v2-append`,
`--v2-gather`, `--v2-slots SPEC` time plug-ins beside ours);
`python -m blocktable.cli.bench_v2 [--tiny]` runs it alone.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from blocktable.cli.bench_v2_step import Shape, Step, build
from blocktable.cli.timing import time_call

OPS = ("append", "gather", "slots")  # the plug-in kinds, in the order the tables give them
GPU_SHAPES = [
    Shape("decode-256", 256, 4096, groups=1, dummies=4, resumed=2),
    Shape("decode-256", 256, 4096, groups=4, dummies=4, resumed=2),
    Shape("decode-1024", 1024, 4096, groups=1, dummies=8, resumed=8),
    Shape("decode-1024", 1024, 4096, groups=4, dummies=8, resumed=8),
    Shape("mixed-4x1024+252", 256, 8192, groups=4, prefills=4, prefill_tokens=1024, dummies=4, resumed=2),
    Shape("prefill-8x2048", 8, 8192, groups=4, prefills=8, prefill_tokens=2048, pad_requests=0,
          max_tokens=16384),
    Shape("1024x2048-context", 1024, 2048, groups=4, min_context=2048, dummies=8, resumed=8),
    Shape("decode-1024", 1024, 16384, groups=4, dummies=8, resumed=8, cp=(4, 1, 1)),
]
QUICK_SHAPES = [GPU_SHAPES[i] for i in (0, 1, 4, 6)]
TINY_SHAPES = [  # the interpreter: the code path, not a measurement
    Shape("decode-6", 6, 40, groups=1, dummies=1, resumed=1, pad_requests=2, max_tokens=16),
    Shape("mixed-2x9+3", 6, 40, groups=4, prefills=2, prefill_tokens=9, dummies=1, resumed=1, pad_requests=2,
          max_tokens=32, cp=(2, 1, 4)),
]


@dataclass
class V2Row:
    case: str
    op: str  # "append", "gather" or "slots"
    kernel: str  # "triton" (ours), "torch" (torch-native) or a plug-in
    calls: int  # 1: one call for every group; G: one call per group (the launch comparison)
    groups: int
    requests: int
    tokens: int
    microseconds: float | None
    bytes: int
    ok: bool
    timing: str  # "cuda-graph", "plain launches", "interpreter", or "" where not timed
    note: str = ""

    @property
    def gbps(self) -> float | None:
        return self.bytes / self.microseconds / 1e3 if self.microseconds else None


@dataclass
class Prepared:
    """One operation on one step: `state` holds every buffer a call writes (cloned per
    implementation, so that all start equal); `call(fn, state)` runs one."""

    names: list[str]  # each state buffer, as a difference names it
    state: list[torch.Tensor]
    call: Callable[[Callable, list[torch.Tensor]], None]


def implementations(op: str, extra: dict[str, Callable] | None = None) -> dict[str, Callable]:
    """Ours ("triton"), the torch-native baseline ("torch"), then any plug-ins of `op`."""
    from blocktable import v2, v2_torch

    ours: dict[str, tuple[Callable, Callable]] = {
        "append": (v2.append_triton, v2_torch.append_torch), "gather": (v2.gather_triton, v2_torch.gather_torch),
        "slots": (v2.slot_mappings_triton, v2_torch.slot_mappings_torch)}
    triton, native = ours[op]
    return {"triton": triton, "torch": native, **(extra or {})}


def prepare(step: Step, op: str, per_group: bool = False) -> Prepared:
    """The buffers and the call of `op`; `per_group`: the slot mappings as one call per group."""
    G = step.groups
    if op == "append":
        s = step.staged
        return Prepared([f"rows[{g}]" for g in range(G)] + ["cnt_dev"], [*step.rows, step.cnt_before],
                        lambda fn, st: fn(st[:G], st[G], step.cnt, s["group"], s["row"], s["start"], s["ids"],
                                          s["cu"]))
    if op == "gather":
        return Prepared([f"inp[{g}]" for g in range(G)], list(step.inp),
                        lambda fn, st: fn(step.rows, step.cnt, st, step.idx_mapping, step.num_reqs_padded))
    args = (step.idx_mapping, step.query_start_loc, step.positions)
    if not per_group:
        return Prepared(["slots"], [step.slots], lambda fn, st: fn(step.rows, *args, st[0], step.num_tokens_padded,
                                                                   **step.slot_keywords()))

    def each_group(fn: Callable, st: list[torch.Tensor]) -> None:
        for g in range(G):
            fn([step.rows[g]], *args, st[0][g:g + 1], step.num_tokens_padded, **step.slot_keywords(g))

    return Prepared(["slots"], [step.slots], each_group)


def difference(names: list[str], ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> str | None:
    """None if every buffer is equal bit for bit, else where the first one differs."""
    for name, a, b in zip(names, ours, theirs):
        if torch.equal(a, b):
            continue
        x, y = a.cpu().numpy(), b.cpu().numpy()
        where = np.argwhere(x != y)
        first = tuple(int(i) for i in where[0])
        return (f"{name} differs in {len(where)} of {x.size} entries, first at {list(first)}: "
                f"ours {x[first]}, found {y[first]}")
    return None


def bench_op(step: Step, op: str, backend: Any, extra: dict[str, Callable] | None = None) -> list[V2Row]:
    """Every implementation of `op` from equal buffers, compared with ours bit for bit,
    then timed; one that differs or raises is reported and not timed. For the slot
    mappings of several groups, each implementation also as one call per group."""
    from blocktable.checks import data_checks

    fns = implementations(op, extra)
    variants = [False, True] if op == "slots" and step.groups > 1 else [False]
    with data_checks(False):  # the kernels are called directly: nothing reads the device back
        return [row for per_group in variants for row in _bench_variant(step, op, fns, per_group, backend)]


def _bench_variant(step: Step, op: str, fns: dict[str, Callable], per_group: bool, backend: Any) -> list[V2Row]:
    cuda = backend.name == "cuda"
    prepared = prepare(step, op, per_group)
    states: dict[str, list[torch.Tensor]] = {}
    raised: dict[str, str] = {}
    for name, fn in fns.items():
        states[name] = [t.clone() for t in prepared.state]
        try:
            prepared.call(fn, states[name])
        except Exception as e:  # a plug-in that refuses the call is reported, not timed
            raised[name] = f"RAISED {type(e).__name__}: {e}"
    anchor = states["triton"]
    if per_group:  # each one-call-per-group run must equal ours as one launch
        anchor = [t.clone() for t in prepared.state]
        prepare(step, op).call(fns["triton"], anchor)
    rows = []
    for name, fn in fns.items():
        differs = None if name in raised else difference(prepared.names, anchor, states[name])
        us: float | None = None
        timing = ""
        if name in raised:
            note = raised[name]
        elif differs is not None:
            what = "one call per group vs our one launch" if per_group else f"{name} vs triton"
            note = f"OUTPUTS DIFFER ({what}: {differs}): not timed"
        else:
            us, note = time_call(functools.partial(prepared.call, fn, states[name]), cuda)
            timing = "interpreter" if not cuda else "plain launches" if note else "cuda-graph"
        rows.append(V2Row(step.shape.label(), op, name, step.groups if per_group else 1, step.groups,
                          step.shape.requests, step.shape.tokens, us, step.bytes[op], us is not None, timing, note))
    return rows


def run_suite(backend: Any, shapes: list[Shape] | None = None, seed: int = 0, quick: bool = False,
              report: Callable[[V2Row], None] | None = None,
              extra: dict[str, dict[str, Callable]] | None = None) -> list[V2Row]:
    """Every op on every shape. `extra`: plug-ins by kind ("append", "gather", "slots"),
    each {name: fn}, timed beside ours."""
    cuda = backend.name == "cuda"
    if shapes is None:
        shapes = (QUICK_SHAPES if quick else GPU_SHAPES) if cuda else TINY_SHAPES
    rows: list[V2Row] = []
    for shape in shapes:
        step = build(shape, backend.device, seed)
        for op in OPS:
            for row in bench_op(step, op, backend, (extra or {}).get(op)):
                rows.append(row)
                if report:
                    report(row)
        del step
        if cuda:
            torch.cuda.empty_cache()
    return rows


def describe(row: V2Row) -> str:
    """How the kernel column names a row: the launch comparison's rows say how they call."""
    if row.op != "slots" or row.groups == 1:
        return row.kernel
    return f"{row.kernel}, {row.groups} calls of 1 group" if row.calls > 1 else f"{row.kernel}, 1 call"


def render_markdown(rows: list[V2Row], device: str, timed: bool) -> str:
    lines = [f"Device: {device}.",
             "Times: medians of CUDA-graph replays, or of plain launches where `timed as` says so. GB/s: the "
             "bytes a call must move at least. vs torch: the torch-native time over this one." if timed else
             "No GPU: interpreter wall times, not timings; no bandwidth and no ratio are computed.", ""]
    if not timed:
        lines += ["| case | op | kernel | interpreter wall µs | note |", "| --- | --- | --- | --- | --- |"]
        for r in rows:
            wall = f"{r.microseconds:.0f}" if r.microseconds is not None else "-"
            lines.append(f"| {r.case} | {r.op} | {describe(r)} | {wall} | {r.note} |")
        return "\n".join(lines) + "\n"
    lines += ["| case | op | kernel | µs | GB/s | vs torch | timed as | note |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    native = {(r.case, r.op): r.microseconds for r in rows if r.kernel == "torch" and r.calls == 1}
    for r in rows:
        if r.calls > 1:
            continue
        if r.microseconds is None:
            lines.append(f"| {r.case} | {r.op} | {r.kernel} | - | - | - | - | {r.note} |")
            continue
        baseline = native.get((r.case, r.op))
        speed = f"{baseline / r.microseconds:.2f}x" if baseline else "-"
        lines.append(f"| {r.case} | {r.op} | {r.kernel} | {r.microseconds:.2f} | {r.gbps:.0f} | {speed} | "
                     f"{r.timing} | {r.note} |")
    split = [r for r in rows if r.calls > 1]
    if split:
        lines += ["", "Slot mappings of every group in one call against one call per group (the same kernel; "
                      "outputs checked equal first):", "",
                  "| case | kernel | one call µs | one call per group µs | per group / one call | timed as | note |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        one = {(r.case, r.kernel): r for r in rows if r.op == "slots" and r.calls == 1}
        for r in split:
            single = one.get((r.case, r.kernel))
            a = single.microseconds if single else None
            b = r.microseconds
            ratio = f"{b / a:.2f}x" if a and b else "-"
            lines.append(f"| {r.case} | {r.kernel} | {f'{a:.2f}' if a else '-'} | {f'{b:.2f}' if b else '-'} | "
                         f"{ratio} | {r.timing or '-'} | {r.note} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from blocktable import device

    argv = sys.argv[1:] if argv is None else argv
    backend = device.select("auto")
    shapes = TINY_SHAPES if "--tiny" in argv else None
    rows = run_suite(backend, shapes, report=lambda r: print(
        f"{r.case:<32} {r.op:<7} {describe(r):<28} "
        + (f"{r.microseconds:10.2f} µs" if r.microseconds else "         -   ") + f"  {r.timing}  {r.note}",
        flush=True))
    print(render_markdown(rows, backend.describe(), backend.name == "cuda"))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
