"""The data oracle's compilations (blocktable/oracle.py): the instruments every
lockstep run on a GPU writes, copies and reads back its token values with. They leave
sizes and alignments unspecialized, so a variant is a tile: one for the write, one for
the gather, and for a block copy the power of two at or above a block's slots, up to
the oracle's tile. On a GPU the calls take the Triton engine whatever
BLOCKTABLE_ORACLE says (the record a warm leaves does not see the setting); under the
interpreter, where nothing compiles, the engine a run takes there (torch unless the
setting asks for Triton)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import torch

from blocktable.device import Backend, upload
from blocktable.oracle import GPU_TILE, DeviceCache
from blocktable.plugin import KVKernels


@dataclasses.dataclass(frozen=True)
class OracleCall:
    """A block copy of `block_slots` slots; None: a write and a gather."""

    block_slots: int | None

    def describe(self) -> str:
        if self.block_slots is None:
            return "data oracle, write and gather"
        return f"data oracle, copy of {self.block_slots}-slot blocks"

    def launches(self, kernels: KVKernels, backend: Backend) -> Iterator[str]:
        engine = None if backend.interpreted else "triton"
        if self.block_slots is not None:
            cache = DeviceCache(2 * self.block_slots, backend=backend, engine=engine)
            cache.copy_blocks([(0, 1)], self.block_slots)
            yield "copy"
            return
        cache = DeviceCache(2, backend=backend, engine=engine)
        slots = upload(torch.zeros((1, 1), dtype=torch.int64), backend)
        cache.write(slots, upload(torch.zeros(1, dtype=torch.int64), backend), check=False)
        yield "write"
        table = upload(torch.zeros((1, 1), dtype=torch.int32), backend)
        cache.gather(table, np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.int64), kv_block_size=1,
                     kernel_block_size=1)
        yield "gather"


def calls() -> list[OracleCall]:
    return [OracleCall(None), *(OracleCall(1 << k) for k in range(GPU_TILE.bit_length()))]
