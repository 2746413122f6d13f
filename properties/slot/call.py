"""One stateless slot-mapping call (a contract example, a stateless-fuzz case) as
case-file data, and running it through a kernel behind guards, compared whole with
the reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from blocktable.device import Backend
from blocktable.plugin import SLOT_MAPPING, SlotMappingFn
from blocktable.properties import fault
from blocktable.properties.compare import Discrepancy, Handed, raised
from blocktable.properties.outcome import Outcome
from blocktable.properties.slot.compare import check_slot_mapping
from blocktable.properties.slot.guard import GuardedCall
from blocktable.reference import slot_mapping as reference_slot_mapping


def slot_call(name: str, config: dict[str, int], qsl: np.ndarray, positions: np.ndarray, table: np.ndarray,
              max_num_tokens: int) -> dict[str, Any]:
    """A stateless call as case-file data."""
    return {"name": name, "config": dict(config), "query_start_loc": qsl.tolist(), "positions": positions.tolist(),
            "block_table": table.tolist(), "width": int(table.shape[1]), "max_num_tokens": int(max_num_tokens)}


def run_slot_call(call: dict[str, Any], kernel: SlotMappingFn, backend: Backend) -> Outcome:
    qsl = np.array(call["query_start_loc"], dtype=np.int32)
    positions = np.array(call["positions"], dtype=np.int64)
    table = np.array(call["block_table"], dtype=np.int32).reshape(-1, call["width"])
    tmax = call["max_num_tokens"]
    config = call["config"]
    expected = reference_slot_mapping(qsl, positions, table, tmax, **config)
    device = backend.device
    guarded = GuardedCall(table.shape[0], table.shape[1], len(qsl) - 1, len(positions), tmax, device)
    args = (guarded.qsl.load(torch.from_numpy(qsl).to(device)),
            guarded.positions.load(torch.from_numpy(positions).to(device)),
            guarded.table.load(torch.from_numpy(table).to(device)),
            guarded.output())
    handed = Handed.of(SLOT_MAPPING, args)
    try:
        kernel(*args, **config)
        handed.check(f"{call['name']} slot mapping")  # before anything reads the output
        guarded.check()
        check_slot_mapping(f"{call['name']} slot mapping", expected, args[3].cpu().numpy(), group=None,
                           rank=None, config=config, query_start_loc=qsl, positions=positions,
                           table=table, requests=list(range(len(qsl) - 1)))
    except Discrepancy as e:
        return Outcome(False, e)
    except Exception as e:
        fault.check(e)
        return Outcome(False, raised(f"{call['name']} slot mapping", e))
    return Outcome(True)
