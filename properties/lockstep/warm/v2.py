"""The V2 block tables' compilations (blocktable/v2.py). Their sizes and pointer
alignments are unspecialized; a variant is the column tile (every row within
NARROW_COLUMNS columns, or not) and the dtype of idx_mapping, which §10.5 lets be
int32 or int64. Under the interpreter, where nothing compiles, the calls take the
kernels a run takes there: torch-native unless the environment asks for Triton
(Triton 3.6's interpreter cannot run these kernels' loops over run-time bounds)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import torch

from blocktable.device import Backend, upload
from blocktable.plugin import KVKernels
from blocktable.properties.lockstep.strategies import V2_KERNELS_VARIABLE
from blocktable.v2 import NARROW_COLUMNS, TRITON_KERNELS, BlockTables
from blocktable.v2_torch import TORCH_KERNELS


@dataclasses.dataclass(frozen=True)
class V2Call:
    """One column tile: an append, and a gather and a slot mapping per idx dtype."""

    wide: bool

    def describe(self) -> str:
        return f"V2 tables, rows {'over' if self.wide else 'within'} {NARROW_COLUMNS} columns"

    def launches(self, kernels: KVKernels, backend: Backend) -> Iterator[str]:
        width = NARROW_COLUMNS + 1 if self.wide else 1
        torch_native = backend.interpreted and os.environ.get(V2_KERNELS_VARIABLE) != "triton"
        ours = TORCH_KERNELS if torch_native else TRITON_KERNELS
        tables = BlockTables([16], 1, 1, [width], backend=backend, kernels=ours)
        tables.append_block_ids(0, [[1]], False)
        tables.apply_staged_writes()
        yield "append"
        qsl = upload(torch.tensor([0, 1], dtype=torch.int32), backend)
        positions = upload(torch.zeros(1, dtype=torch.int64), backend)
        for dtype in (torch.int32, torch.int64):
            idx = upload(torch.zeros(1, dtype=dtype), backend)
            tables.gather_block_tables(idx, 1)
            yield f"gather, {dtype}"
            tables.compute_slot_mappings(idx, qsl, positions, 1)
            yield f"slot mappings, {dtype}"


def calls() -> list[V2Call]:
    return [V2Call(False), V2Call(True)]
