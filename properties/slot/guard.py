"""Guard regions around every tensor handed to a kernel under test.

The block table the kernel sees is the interior of a larger buffer whose extra
rows and columns hold GUARD_BLOCK, so a kernel that reads outside its row (or past
the table) reads poison and produces a slot the reference never would, even on the
CPU, where the interpreter reads stray memory silently. Inputs get trailing guards
too, and the output sits between guard cells that the kernel must leave alone.
After each call the guards, and the inputs, must be exactly as they were.

Two ways to hold them. GuardedCall makes and checks every buffer on the device:
the stateless fuzzer's batches are made there and are too big to bring back.
StagedCall, for the lockstep machines' small calls, lays every buffer out on the
host, sends them in one copy and brings them back, outputs included, in one
read-back: on a GPU each small device operation costs about as much as the
kernel, and a step makes one such call per group.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from blocktable.device import copy_from_host, to_host
from blocktable.properties.compare import Discrepancy, same_values

GUARD_BLOCK = -0x5A5A5A5A  # a negative block id: any slot made from it is negative and not -1
GUARD_ROWS = 2
GUARD_COLS = 4
GUARD_TOKENS = 64
GUARD_SLOT = 0x3C3C3C3C3C3C3C3C  # around the output: a kernel must not write there
GUARD_POSITION = 0x7FFF_FFFF_FFFF  # past the last position: never a position the harness schedules
GUARD_QSL = 0x7FFF_FFFF


UNWRITTEN = 0x5A5A5A5A5A5A5A5A  # poured into every kernel output first: an unwritten slot shows


def geometry(shape: tuple[int, ...], pad: tuple[int, ...], lead: bool) -> tuple[tuple[int, ...], tuple[slice, ...]]:
    """(the buffer's shape, the index of the guarded tensor in it) for a margin `pad`
    per dim, before and after (lead) or after only."""
    outer = tuple(n + (2 if lead else 1) * p for n, p in zip(shape, pad))
    index = tuple(slice(p if lead else 0, (p if lead else 0) + n) for n, p in zip(shape, pad))
    return outer, index


class Guarded:
    """A tensor of `shape` living inside a buffer of `fill`, margin `pad` per dim
    (before and after, or after only). The buffer is allocated on `device` unless
    `buffer` (already holding the guards) is given."""

    def __init__(self, shape: tuple[int, ...], pad: tuple[int, ...], dtype: torch.dtype, fill: int,
                 device: torch.device, lead: bool = True, buffer: torch.Tensor | None = None) -> None:
        self.fill = fill
        outer, self.index = geometry(shape, pad, lead)
        self.buffer = torch.full(outer, fill, dtype=dtype, device=device) if buffer is None else buffer
        self.view = self.buffer[self.index]
        self.pristine: torch.Tensor | None = None

    def load(self, value: torch.Tensor) -> torch.Tensor:
        """An input: the kernel must change nothing, the view included."""
        self.view.copy_(value)
        self.pristine = self.buffer.clone()
        return handed(self.view)

    def pour(self, value: int) -> torch.Tensor:
        """An output filled with `value`: the kernel may write the view, not the guard."""
        self.view.fill_(value)
        self.pristine = None
        return self.view

    def changed(self) -> torch.Tensor:
        """Where the buffer differs from what the kernel was handed, the view of an
        output excepted (on the device)."""
        if self.pristine is not None:
            return self.buffer != self.pristine
        changed = self.buffer != self.fill
        changed[self.index] = False
        return changed

    def changed_on_host(self, now: np.ndarray, pristine: np.ndarray | None) -> np.ndarray:
        """The same for `now`, the buffer's copy on the host, against `pristine`, the
        bytes it was handed (None for an output: against its fill)."""
        if pristine is not None:
            return np.asarray(now != pristine)
        changed = np.asarray(now != self.fill)
        changed[self.index] = False
        return changed


def handed(view: torch.Tensor) -> torch.Tensor:
    """What a kernel is handed for `view`. A zero-size tensor owns no memory (its
    address is 0 on the CPU and on CUDA), so a kernel that reads any of it, even in
    a lane whose result it drops, faults here as it would in an engine; a view into
    the guard would hide it."""
    if view.numel() == 0:
        return torch.empty(view.shape, dtype=view.dtype, device=view.device)
    return view


def alias(tensor: torch.Tensor) -> torch.Tensor:
    """A new tensor object over the same memory. The staged buffers' tensors live as
    long as their geometry's cache entry: a kernel that resizes or re-points the one it
    was handed (a finding, properties/compare.py) must not hand every later call of the
    geometry, in this program or the next, its changed tensor."""
    return tensor.view(tensor.shape)


def call_parts(rows: int, width: int, num_reqs: int, num_tokens: int, calls: int,
               max_tokens: int) -> list[tuple[tuple[int, ...], tuple[int, ...], type, int, bool]]:
    """(shape, pad, dtype, fill, lead) of a call's four buffers: the table, query_start_loc,
    positions, and the outputs (one row per call)."""
    return [((rows, width), (GUARD_ROWS, GUARD_COLS), np.int32, GUARD_BLOCK, True),
            ((num_reqs + 1,), (GUARD_TOKENS,), np.int32, GUARD_QSL, False),
            ((num_tokens,), (GUARD_TOKENS,), np.int64, GUARD_POSITION, False),
            ((calls, max_tokens), (0, GUARD_TOKENS), np.int64, GUARD_SLOT, True)]


def label(group: int | None, rank: int | None) -> str:
    """How reports name the calls of one group and rank: "group 0 rank 1"."""
    return " ".join(part for part in (f"group {group}" if group is not None else "",
                                      f"rank {rank}" if rank is not None else "") if part)


class _CallBuffers:
    """What both ways of holding a call's buffers share: the four guarded parts (table,
    query_start_loc, positions, outputs), whose calls they are (a group, and each
    output's rank), and the report of the first part a kernel changed."""

    table: Guarded
    qsl: Guarded
    positions: Guarded
    out: Guarded
    group: int | None
    ranks: tuple[int | None, ...]  # each output's

    @property
    def rank(self) -> int | None:
        """The rank whose call this is, when it is one rank's (the inputs' owner)."""
        return self.ranks[0] if len(self.ranks) == 1 else None

    def parts(self) -> list[tuple[Guarded, str | None]]:
        return [(self.table, "block_table"), (self.qsl, "query_start_loc"), (self.positions, "positions"),
                (self.out, None)]

    def _report(self, changes: list[np.ndarray]) -> None:
        """Raise for the first part with a change in it."""
        for (_, what), changed in zip(self.parts(), changes):
            if changed.any():
                where = [int(i) for i in np.argwhere(changed)[0]]
                rank = self.rank if what is not None else self.ranks[where[0]]
                tensor = what or "slot_mapping"
                name = f"{label(self.group, rank)} {tensor}".strip()
                place = "outside" if what is None else "into"
                raise Discrepancy(f"{tensor} guard", f"the kernel wrote {place} {name} (buffer index {where}, "
                                                     f"{int(changed.sum())} elements changed)",
                                  group=self.group, rank=rank)


class GuardedCall(_CallBuffers):
    """The contract tensors of one or more slot-mapping calls on the same inputs (one
    per DCP rank, say), made and checked on the device: the three inputs, each
    behind guards, and one output row per call in a single guarded buffer, every
    row between guard cells. `group` and `ranks` (one per output) say whose calls
    they are, in reports."""

    def __init__(self, rows: int, width: int, num_reqs: int, num_tokens: int, max_tokens: int,
                 device: torch.device, group: int | None = None, ranks: tuple[int | None, ...] = (None,)) -> None:
        self.table, self.qsl, self.positions, self.out = (
            Guarded(shape, pad, _TORCH[np.dtype(dtype)], fill, device, lead)
            for shape, pad, dtype, fill, lead in call_parts(rows, width, num_reqs, num_tokens, len(ranks),
                                                            max_tokens))
        self.outputs = self.out.pour(UNWRITTEN)  # [calls, max_tokens]
        self.group, self.ranks = group, ranks

    def output(self, i: int = 0) -> torch.Tensor:
        """Call i's output."""
        return handed(self.outputs[i])

    def reset(self) -> None:
        """Every buffer as it was made, in the same memory, for the same call again:
        guards whole, outputs poured (the inputs are loaded again by the caller)."""
        for guarded, _ in self.parts():
            guarded.buffer.fill_(guarded.fill)
        self.outputs = self.out.pour(UNWRITTEN)

    def check(self) -> None:
        """Every guard and input as it was. One device sync for every call together
        (nothing touched is the common case); the detail only on failure."""
        changes = [guarded.changed() for guarded, _ in self.parts()]
        if bool(torch.stack([torch.any(c) for c in changes]).any()):
            self._report([c.cpu().numpy() for c in changes])


ALIGN = 64  # bytes: each buffer starts where a fresh allocation would be aligned


@dataclass(frozen=True)
class StagedLayout:
    """Where a StagedCall's four buffers lie in its packed bytes, and those bytes
    before the inputs go in: guards everywhere, the table's interior included (the
    table comes by a device copy), the outputs UNWRITTEN."""

    spans: tuple[tuple[int, int], ...]  # byte range of each buffer
    dtypes: tuple[np.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]  # each buffer's, guards included
    insides: tuple[tuple[slice, ...], ...]  # the guarded tensor's index in each buffer
    template: np.ndarray  # read-only


@functools.lru_cache(maxsize=256)
def staged_layout(rows: int, width: int, num_reqs: int, num_tokens: int, calls: int,
                  max_tokens: int) -> StagedLayout:
    """The layout of one call geometry, made once: a lockstep run makes many calls
    of the same few geometries, and laying one out costs more than copying it."""
    parts = call_parts(rows, width, num_reqs, num_tokens, calls, max_tokens)
    dtypes = tuple(np.dtype(dtype) for _, _, dtype, _, _ in parts)
    shapes, insides = zip(*(geometry(shape, pad, lead) for shape, pad, _, _, lead in parts))
    spans = []
    end = 0
    for shape, dtype in zip(shapes, dtypes):
        start = -(-end // ALIGN) * ALIGN
        end = start + math.prod(shape) * dtype.itemsize
        spans.append((start, end))
    template = np.zeros(end, dtype=np.uint8)
    for (a, b), dtype, shape, (_, _, _, fill, _) in zip(spans, dtypes, shapes, parts):
        template[a:b].view(dtype).reshape(shape)[...] = fill
    a, b = spans[3]
    template[a:b].view(dtypes[3]).reshape(shapes[3])[insides[3]] = UNWRITTEN
    template.flags.writeable = False
    return StagedLayout(tuple(spans), dtypes, shapes, insides, template)


class StagedBuffers:
    """Both sides of one call geometry, made once per device and reused call after
    call: the host bytes a call is laid out in (pinned on a GPU, so that they go
    over without a wait) and the device bytes with the guarded views into them.
    Each call lays the whole template out again (guards included), sends it, and
    owns both until the next call of the same geometry, so a stray write in one call
    cannot outlive it."""

    def __init__(self, layout: StagedLayout, parts: list, device: torch.device) -> None:
        self.host_bytes = torch.from_numpy(layout.template.copy())
        if device.type == "cuda":
            self.host_bytes = self.host_bytes.pin_memory()
        self.device_bytes = torch.empty_like(self.host_bytes, device=device)  # every call sends all of it
        self.parts = tuple(
            Guarded(shape, pad, _TORCH[np.dtype(dtype)], fill, device, lead,
                    buffer=self.device_bytes[a:b].view(_TORCH[np.dtype(dtype)]).reshape(outer))
            for (shape, pad, dtype, fill, lead), (a, b), outer in zip(parts, layout.spans, layout.shapes))
        table, qsl, positions, out = self.parts
        self.inputs = (handed(qsl.view), handed(positions.view), handed(table.view))
        self.outputs = tuple(handed(out.view[i]) for i in range(out.view.shape[0]))
        self.owner: object = None


@functools.lru_cache(maxsize=256)  # at most about 0.8 MB each (a 16k-token table and 8 ranks' outputs)
def staged_buffers(geometry: tuple[int, ...], device: torch.device, slot: int = 0) -> StagedBuffers:
    """The buffers of `geometry`; calls that must coexist (one per group in a step,
    checked together) take different `slot`s."""
    return StagedBuffers(staged_layout(*geometry), call_parts(*geometry), device)


class StagedCall(_CallBuffers):
    """The same guarded buffers as a GuardedCall, for host inputs (the table excepted,
    which is the implementation's own device tensor): every buffer is laid out on
    the host in one byte array and sent in one copy; `check` brings all of them back, with the table they were
    copied from, in one read-back and compares on the host.

    The device buffers of a geometry are made once and reused (staged_buffers): a
    call must be checked before the next call of its geometry is made, and checking
    it afterwards is refused rather than misread as a stray write."""

    def __init__(self, table: torch.Tensor, qsl: np.ndarray, positions: np.ndarray, max_tokens: int,
                 group: int | None = None, ranks: tuple[int | None, ...] = (None,), slot: int = 0) -> None:
        rows, width = table.shape
        geometry = (rows, width, len(qsl) - 1, len(positions), len(ranks), max_tokens)
        layout = staged_layout(*geometry)
        self.spans = layout.spans
        self.stage = staged_buffers(geometry, table.device, slot)
        self.stage.owner = self._ticket = object()  # not the call itself: the cache must not keep it alive
        # What the kernel is handed, byte for byte; self.host views each buffer in it.
        # The previous call of this geometry was checked (a read-back: its copy from
        # these bytes has run) or abandoned (its copy runs first and is overwritten).
        self.packed = self.stage.host_bytes.numpy()
        self.packed[:] = layout.template
        self.host = [self.packed[a:b].view(dtype).reshape(shape)
                     for (a, b), dtype, shape in zip(layout.spans, layout.dtypes, layout.shapes)]
        self.host[1][layout.insides[1]] = qsl
        self.host[2][layout.insides[2]] = positions
        self.device_bytes = self.stage.device_bytes
        copy_from_host(self.device_bytes, self.stage.host_bytes)  # never the caller's arrays themselves
        self.table, self.qsl, self.positions, self.out = self.stage.parts
        self.outputs = self.out.view  # [calls, max_tokens]: UNWRITTEN
        self.group, self.ranks = group, ranks
        self.source = table
        self.table.view.copy_(table)

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query_start_loc, positions, block_table) as the kernel is handed them."""
        qsl, positions, table = self.stage.inputs
        return alias(qsl), alias(positions), alias(table)

    def output(self, i: int = 0) -> torch.Tensor:
        return alias(self.stage.outputs[i])

    def readback(self) -> list[torch.Tensor]:
        """What `check` compares: the bytes the kernel was handed and the table they were
        copied from. A caller with several calls brings all of them back in one copy."""
        self._refuse_if_reused()
        return [self.device_bytes, self.source]

    def check(self, back: list[np.ndarray] | None = None) -> np.ndarray:
        """Every guard and input as it was; returns the outputs [calls, max_tokens] on
        the host. `back`: `readback()` already on the host (else it is read here). One
        comparison when nothing was touched (the common case); the detail only on failure."""
        self._refuse_if_reused()
        handed_bytes, table = to_host(self.readback()) if back is None else back
        now = [handed_bytes[a:b].view(host.dtype).reshape(host.shape) for host, (a, b) in zip(self.host, self.spans)]
        self.host[0][self.table.index] = table  # as it was copied
        outputs = now[3][self.out.index]
        self.host[3][self.out.index] = outputs  # the kernel's to write
        if same_values(handed_bytes, self.packed):
            return outputs
        self._report([guarded.changed_on_host(n, None if guarded is self.out else host)
                      for (guarded, _), n, host in zip(self.parts(), now, self.host)])
        where = int(np.flatnonzero(handed_bytes != self.packed)[0])
        raise Discrepancy("guard", f"the kernel wrote between the guarded buffers (byte {where})", group=self.group,
                          rank=self.rank)

    def _refuse_if_reused(self) -> None:
        if self.stage.owner is not self._ticket:
            raise RuntimeError("a later call of the same geometry has reused this call's buffers: "
                               "check each StagedCall before making the next")


_TORCH = {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64}
