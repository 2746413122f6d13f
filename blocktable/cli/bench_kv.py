"""Timing the KV path (docs/contract.md §9): our Triton kernels beside the torch-native
versions (blocktable.kv's `*_torch`), for write, copy and gather, against a
device-to-device copy's bandwidth measured in the same run.

Each case is first run by every implementation from the same starting buffers and
each one's outputs compared with ours bit for bit (whole caches or outputs; ours are
proven equal to the reference by the test suite): one that differs or raises is
reported and not timed. Times are medians of CUDA-graph replays where a call
can be captured (the torch-native write selects its tokens with a device sync, so
it falls back to plain launches, and says so), with the data-dependent checks off:
they read the device back and are not the kernels' cost. Bandwidth counts the bytes
a call must move at least (inputs read once, outputs written once, ids and lengths).

Under the interpreter the same code runs on tiny shapes: it checks the path, and
its wall times are not timings. `blocktable bench` runs this after the slot-mapping
suite (`--kv-write/--kv-copy/--kv-gather SPEC` time plug-ins beside ours);
`python -m blocktable.cli.bench_kv [--tiny]` runs it alone.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from blocktable.cli.timing import copy_bandwidth, time_call


@dataclass(frozen=True)
class Case:
    op: str  # "write", "copy" or "gather"
    tokens: int  # write: tokens; copy: pairs; gather: total tokens
    heads: int = 8
    head_size: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16  # the key's (write), or the "auto" cache's
    kv_cache_dtype: str = "auto"
    layout: str = "NHD"
    requests: int = 1  # gather
    layers: int = 1  # copy

    def name(self) -> str:
        what = {"write": f"{self.tokens:,} tokens", "copy": f"{self.tokens:,} pairs x {self.layers} layers",
                "gather": f"{self.requests} x {self.tokens // self.requests:,} tokens"}[self.op]
        cache = "fp8" if self.kv_cache_dtype == "fp8_e4m3" else str(self.dtype).removeprefix("torch.")
        return f"{self.op} {what}, {self.heads}x{self.head_size} {cache} {self.layout}"


# A large call of each (the ≥ 80% target is about these), then fp8 and the other layout.
GPU_CASES = [
    Case("write", 1 << 20), Case("write", 1 << 20, layout="HND"), Case("write", 1 << 20, kv_cache_dtype="fp8_e4m3"),
    Case("copy", 4096, layers=4), Case("copy", 4096, layers=4, kv_cache_dtype="fp8_e4m3"),
    Case("gather", 1 << 20, requests=256), Case("gather", 1 << 20, requests=256, layout="HND"),
    Case("gather", 1 << 20, requests=256, kv_cache_dtype="fp8_e4m3"),
]
TINY_CASES = [  # the interpreter: the code path, not a measurement
    Case("write", 8, heads=2, head_size=8, block_size=4), Case("write", 8, 2, 8, 4, kv_cache_dtype="fp8_e4m3"),
    Case("copy", 4, 2, 8, 4, layers=2), Case("gather", 12, 2, 8, 4, requests=3, layout="HND"),
    Case("gather", 12, 2, 8, 4, requests=3, kv_cache_dtype="fp8_e4m3"),
]


@dataclass
class KvRow:
    case: str
    kernel: str  # "triton" (ours) or "torch" (torch-native)
    microseconds: float | None
    bytes: int
    ok: bool
    note: str = ""

    @property
    def gbps(self) -> float | None:
        return self.bytes / self.microseconds / 1e3 if self.microseconds else None


@dataclass
class Prepared:
    """One case's buffers: `state` holds everything a call writes (cloned per
    implementation so that all start equal); `call(fn, state)` runs one."""

    state: list[torch.Tensor]
    call: Callable[[Callable, list[torch.Tensor]], None]
    bytes: int
    # Per state tensor, where a NaN may be encoded either way (docs/contract.md §9: the
    # cells an fp8 write encodes, the rows a gather decodes); None: bit for bit.
    nan_cells: list[torch.Tensor | None] | None = None


def implementations(op: str, extra: dict[str, Callable] | None = None) -> dict[str, Callable]:
    """Ours ("triton"), the torch-native baseline ("torch"), then any plug-ins of `op`."""
    from blocktable import kv, kv_torch

    ours: dict[str, tuple[Callable, Callable]] = {"write": (kv.write, kv_torch.write_torch),
                                                  "copy": (kv.copy_blocks, kv_torch.copy_blocks_torch),
                                                  "gather": (kv.gather, kv_torch.gather_torch)}
    triton, native = ours[op]
    return {"triton": triton, "torch": native, **(extra or {})}


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: Any, generator: torch.Generator) -> torch.Tensor:
    """Random bits (random values for a float tensor would never hold NaN payloads)."""
    size = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (size,), dtype=torch.uint8, device=device, generator=generator)
    return raw.view(dtype).view(shape)


def _values(shape: tuple[int, ...], dtype: torch.dtype, device: Any, generator: torch.Generator) -> torch.Tensor:
    return (torch.randn(shape, device=device, generator=generator) * 100).to(dtype)


def _cache_shape(case: Case, num_blocks: int) -> tuple[int, int, int, int]:
    if case.layout == "NHD":
        return (num_blocks, case.block_size, case.heads, case.head_size)
    return (num_blocks, case.heads, case.block_size, case.head_size)


def _cache_dtype(case: Case) -> torch.dtype:
    return torch.uint8 if case.kv_cache_dtype == "fp8_e4m3" else case.dtype


def prepare(case: Case, device: Any, seed: int = 0) -> Prepared:
    g = torch.Generator(device=device).manual_seed(seed)
    rng = np.random.default_rng(seed)
    H, D, Bk = case.heads, case.head_size, case.block_size
    cache_dtype = _cache_dtype(case)
    cache_item = torch.empty(0, dtype=cache_dtype).element_size()
    kw = dict(layout=case.layout, kv_cache_dtype=case.kv_cache_dtype, k_scale=0.37, v_scale=2.5)
    if case.op == "write":
        n = case.tokens
        num_blocks = -(-n // Bk) + 1
        key, value = (_values((n, H, D), case.dtype, device, g) for _ in range(2))
        # A prefill's slots: whole blocks in a shuffled order, offsets in order inside each.
        blocks = rng.permutation(num_blocks)[:-(-n // Bk)]
        slots = (np.repeat(blocks, Bk) * Bk + np.tile(np.arange(Bk), len(blocks)))[:n].astype(np.int64)
        slot_mapping = torch.from_numpy(slots).to(device)
        caches = [_poisoned(_cache_shape(case, num_blocks), cache_dtype, device, g) for _ in range(2)]
        nbytes = 2 * n * H * D * (key.element_size() + cache_item) + 8 * n
        written = torch.zeros(num_blocks * Bk, dtype=torch.bool, device=device)
        written[slot_mapping] = True
        written = written.view(num_blocks, Bk, 1, 1) if case.layout == "NHD" else written.view(num_blocks, 1, Bk, 1)
        cells = written.expand(caches[0].shape) if case.kv_cache_dtype == "fp8_e4m3" else None
        return Prepared(caches, lambda fn, s: fn(key, value, s[0], s[1], slot_mapping, **kw), nbytes, [cells, cells])
    if case.op == "copy":
        m = case.tokens
        num_blocks = 4 * m
        caches = [_poisoned(_cache_shape(case, num_blocks), cache_dtype, device, g) for _ in range(2 * case.layers)]
        order = rng.permutation(num_blocks)
        pairs = torch.from_numpy(np.stack([order[:m], order[m:2 * m]], axis=1).astype(np.int64)).to(device)
        L = case.layers
        nbytes = 2 * (2 * L) * m * Bk * H * D * cache_item + 16 * m
        return Prepared(caches, lambda fn, s: fn(s[:L], s[L:], pairs), nbytes)
    N = case.requests
    lengths = np.full(N, case.tokens // N, dtype=np.int64)
    lengths[: case.tokens - int(lengths.sum())] += 1
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)).to(device)
    width = int(-(-lengths.max() // Bk))
    num_blocks = N * width + 1
    table = torch.from_numpy(rng.permutation(num_blocks)[:N * width].reshape(N, width).astype(np.int32)).to(device)
    caches = [_poisoned(_cache_shape(case, num_blocks), cache_dtype, device, g) for _ in range(2)]
    out_dtype = torch.float32 if case.kv_cache_dtype == "fp8_e4m3" else cache_dtype
    outs = [_poisoned((case.tokens, H, D), out_dtype, device, g) for _ in range(2)]
    out_item = torch.empty(0, dtype=out_dtype).element_size()
    nbytes = 2 * case.tokens * H * D * (cache_item + out_item) + 4 * int(N * width + N + 1)
    decoded = torch.ones(outs[0].shape, dtype=torch.bool, device=device)  # every row: cu[N] == tokens
    cells = decoded if case.kv_cache_dtype == "fp8_e4m3" else None
    return Prepared(outs, lambda fn, s: fn(caches[0], caches[1], table, cu, s[0], s[1], **kw), nbytes, [cells, cells])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def same_outputs(a: torch.Tensor, b: torch.Tensor, nan_cells: torch.Tensor | None, strict_nan: bool = False) -> bool:
    """Bit for bit, except that inside `nan_cells` (docs/contract.md §9) e4m3fn's two
    NaN codes are equal, and so is any NaN to any NaN among decoded values; --strict-nan
    holds those exact too."""
    if torch.equal(_bits(a), _bits(b)):
        return True
    if strict_nan or nan_cells is None:
        return False
    if a.dtype == torch.uint8:  # fp8 codes: 0x7F and 0xFF are e4m3fn's NaNs
        nan_codes = torch.tensor([0x7F, 0xFF], dtype=torch.uint8, device=a.device)
        allowed = torch.isin(a, nan_codes) & torch.isin(b, nan_codes)
    else:
        allowed = torch.isnan(a) & torch.isnan(b)
    return not bool(((_bits(a) != _bits(b)) & ~(allowed & nan_cells)).any())


def bench_case(case: Case, backend: Any, seed: int = 0, extra: dict[str, Callable] | None = None,
               strict_nan: bool = False) -> list[KvRow]:
    """Every implementation from equal buffers, each compared bit for bit with ours,
    then timed; one whose outputs differ is reported and not timed."""
    from blocktable.checks import data_checks

    cuda = backend.name == "cuda"
    prepared = prepare(case, backend.device, seed)
    fns = implementations(case.op, extra)
    states = {name: prepared.state if name == "triton" else [t.clone() for t in prepared.state] for name in fns}
    rows = []
    with data_checks(False):  # they read the device back: not capturable, not the kernels' cost
        for name, fn in fns.items():
            try:
                prepared.call(fn, states[name])
            except Exception as e:  # a plug-in that refuses the call is reported, not timed
                states[name] = []
                rows.append(KvRow(case.name(), name, None, prepared.bytes, False, f"RAISED {type(e).__name__}: {e}"))
        cells = prepared.nan_cells or [None] * len(prepared.state)
        same = {name: bool(states[name]) and all(same_outputs(a, b, c, strict_nan)
                                                 for a, b, c in zip(states["triton"], states[name], cells))
                for name in fns}
        for name, fn in fns.items():
            if not states[name]:
                continue
            if same[name] and (name == "triton" or same["triton"]):
                us, note = time_call(functools.partial(prepared.call, fn, states[name]), cuda)
            else:
                us, note = None, f"OUTPUTS DIFFER ({name} vs triton): not timed"
            rows.append(KvRow(case.name(), name, us, prepared.bytes, us is not None, note))
    return rows


def run_suite(backend: Any, cases: list[Case] | None = None, seed: int = 0,
              report: Callable[[KvRow], None] | None = None,
              extra: dict[str, dict[str, Callable]] | None = None,
              strict_nan: bool = False) -> tuple[list[KvRow], float | None]:
    """(rows, the device-to-device copy's GB/s or None without a GPU). `extra`: plug-ins
    by op ("write", "copy", "gather"), each {name: fn}, timed beside ours."""
    cuda = backend.name == "cuda"
    cases = cases if cases is not None else (GPU_CASES if cuda else TINY_CASES)
    copy_gbps = copy_bandwidth(cuda)
    rows = []
    for case in cases:
        for row in bench_case(case, backend, seed, (extra or {}).get(case.op), strict_nan):
            rows.append(row)
            if report:
                report(row)
        if cuda:
            torch.cuda.empty_cache()  # the large cases are gigabytes each
    return rows, copy_gbps


def render_markdown(rows: list[KvRow], copy_gbps: float | None, device: str) -> str:
    lines = [f"Device: {device}.",
             f"Device-to-device copy: {copy_gbps:.0f} GB/s (bytes read + written)." if copy_gbps else
             "No GPU: interpreter wall times, not timings; no bandwidth is computed.", ""]
    lines += (["| case | kernel | µs | GB/s | % of copy | vs torch | note |",
               "| --- | --- | --- | --- | --- | --- | --- |"]
              if copy_gbps else ["| case | kernel | interpreter wall µs | note |", "| --- | --- | --- | --- |"])
    torch_us = {r.case: r.microseconds for r in rows if r.kernel == "torch"}
    for r in rows:
        if not copy_gbps:
            wall = f"{r.microseconds:.0f}" if r.microseconds is not None else "-"
            lines.append(f"| {r.case} | {r.kernel} | {wall} | {r.note} |")
            continue
        if r.microseconds is None:
            lines.append(f"| {r.case} | {r.kernel} | - | - | - | - | {r.note} |")
            continue
        gbps = r.bytes / r.microseconds / 1e3
        share = f"{100 * gbps / copy_gbps:.0f}%"
        baseline = torch_us.get(r.case)
        speed = f"{baseline / r.microseconds:.2f}x" if baseline else "-"
        lines.append(f"| {r.case} | {r.kernel} | {r.microseconds:.1f} | {gbps:.0f} | {share} | {speed} | "
                     f"{r.note} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from blocktable import device

    argv = sys.argv[1:] if argv is None else argv
    backend = device.select("auto")
    cases = TINY_CASES if "--tiny" in argv else None
    rows, copy_gbps = run_suite(backend, cases, report=lambda r: print(
        f"{r.case:<48} {r.kernel:<7} " + (f"{r.microseconds:10.1f} µs" if r.microseconds else "         -   ")
        + f"  {r.note}", flush=True))
    print(render_markdown(rows, copy_gbps, backend.describe()))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
