"""The slot-mapping kernel's compilations: ours, the tiled kernel (blocktable/slot.py),
which is the kernel under test unless a run names another.

Its sizes are run-time arguments. In the lockstep's worlds what picks a variant is:
the search steps (from the request count, up to MAX_NUM_REQS a call); the tile shape
tiled_launch picks (a decode batch; less than a tile per request; a tile or more per
request); and the 16-byte alignment of the table and of the output. The lockstep hands
the kernel views inside guarded buffers (properties/slot/guard.py), whose offsets
follow the table's width and the output's row, so both alignments come. Its divisions
are always multiplies there (its blocks and rows are far from 2**31 positions). A
fuzzing run first checks the contract's worked examples (properties/slot/examples.py),
some of which pass 2**31 positions and divide plainly: they are run here as the run
runs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from blocktable.device import Backend, upload
from blocktable.plugin import KVKernels
from blocktable.properties.lockstep.strategies import MAX_NUM_REQS
from blocktable.properties.slot.call import run_slot_call
from blocktable.properties.slot.examples import SPEC_EXAMPLES

SHAPES = ("decode", "prefill", "long")  # tokens = requests; one more; 1,024 a request


def requests(steps: int) -> int:
    """The fewest requests whose search takes `steps` steps (max(0, N - 1).bit_length())."""
    return 1 if steps == 0 else (1 << (steps - 1)) + 1


@dataclasses.dataclass(frozen=True)
class SlotCall:
    """One search-step count and tile shape: a launch for each alignment of the table
    and the output."""

    steps: int
    shape: str

    def describe(self) -> str:
        return f"slot mapping, {self.shape}, {self.steps} search steps"

    def launches(self, kernels: KVKernels, backend: Backend) -> Iterator[str]:
        from blocktable.slot import slot_mapping_tiled

        N = requests(self.steps)
        per_request = {"decode": 1, "prefill": 1, "long": 1024}[self.shape]
        counts = [per_request] * N
        if self.shape == "prefill":
            counts[0] += 1
        T = sum(counts)
        qsl = upload(torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32), backend)
        positions = upload(torch.zeros(T, dtype=torch.int64), backend)
        tables = upload(torch.zeros(N + 1, dtype=torch.int32), backend)
        outputs = upload(torch.zeros(T + 1, dtype=torch.int64), backend)
        for table_offset in (0, 1):  # int32 elements: 4 bytes off
            for out_offset in (0, 1):  # int64 elements: 8 bytes off
                table = tables[table_offset:table_offset + N].view(N, 1)
                out = outputs[out_offset:out_offset + T]
                slot_mapping_tiled(qsl, positions, table, out, kv_block_size=16, kernel_block_size=16)
                yield f"table offset {table_offset}, output offset {out_offset}"


@dataclasses.dataclass(frozen=True)
class ExamplesCall:
    """The contract's worked examples, through our kernel, as a fuzzing run checks
    them first (properties/run/fuzz.py)."""

    def describe(self) -> str:
        return "slot mapping, the contract's examples"

    def launches(self, kernels: KVKernels, backend: Backend) -> Iterator[str]:
        from blocktable.slot import slot_mapping_tiled

        for example in SPEC_EXAMPLES:
            run_slot_call(example.call(), slot_mapping_tiled, backend)
            yield example.name


def calls() -> list[SlotCall | ExamplesCall]:
    steps = range(max(0, MAX_NUM_REQS - 1).bit_length() + 1)
    return [ExamplesCall(), *(SlotCall(s, shape) for shape in SHAPES for s in steps)]
