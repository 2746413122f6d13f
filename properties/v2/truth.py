"""One V2 call (docs/contract.md §10) as the reference sees it: the state before the
call, what the kernel is handed beside it, and the state the reference leaves.

The state before is a function of the call's seeds alone (every machine and numpy
version gives the same arrays: kv/data.py's splitmix64), so a case file holds a few
numbers instead of whole tables. Group `g`'s arrays follow from `group_seeds[g]`, so
that a call shrunk to fewer groups keeps the survivors' rows as they were.

- rows: kernel block ids spread over [0, 2**31-1], with zeros, ids at or just below
  2**31-1 and small ids among them; every column holds one, so the columns past a count
  are the stale entries a kernel must leave alone.
- counts: some 0, some full to the width, the rest anywhere between. The device counts
  equal the host's (the state right after an apply) unless `synced` is false.
- inp and slots: ids as for rows, and random int64 bits: whatever a kernel must not
  keep (slots) or must keep (inp past a count, rows past num_reqs_padded).

The expected state is the reference's (reference/v2.py's BlockTables): its public
arrays set to the state before, its method called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blocktable.properties.kv.data import pseudo_random_bits
from blocktable.reference.v2 import BlockTables

INT32_MAX = 2**31 - 1
CONFIG_KEYS = ("block_sizes", "kernel_block_sizes", "max_num_blocks_per_group", "max_num_reqs",
               "max_num_batched_tokens", "cp_size", "cp_rank", "cp_interleave", "dcp_sharded",
               "slot_mapping_enabled")


@dataclass
class State:
    """§10.1's device state, and the host counts."""

    rows: list[np.ndarray]  # int32 [Rmax, width_g]
    cnt: np.ndarray  # int32 [G, Rmax], the host's
    cnt_dev: np.ndarray  # int32 [G, Rmax]
    inp: list[np.ndarray]  # int32 [Rmax, width_g]
    slots: np.ndarray  # int64 [G, Tmax]

    def copy(self) -> State:
        return State([a.copy() for a in self.rows], self.cnt.copy(), self.cnt_dev.copy(),
                     [a.copy() for a in self.inp], self.slots.copy())


@dataclass
class Plan:
    """What the kernel is handed beside the state, and what the reference leaves.

    `inputs`: the call's index arrays by argument name (append: `cnt` and the staged
    arrays; gather and slots: `idx_mapping`, slots also `query_start_loc` and
    `positions`); `count`: num_reqs_padded or num_tokens_padded. `staged`: append's
    writes as the host staged them, `origin[i]` the append that staged write i."""

    before: State
    after: State
    inputs: dict[str, np.ndarray]
    count: int | None = None
    staged: list[tuple[int, int, int, list[int]]] = field(default_factory=list)
    origin: list[int] = field(default_factory=list)


def tables(config: dict[str, Any]) -> BlockTables:
    """The reference's BlockTables of a call's configuration (all zero)."""
    return BlockTables(**{k: config[k] for k in CONFIG_KEYS})


def widths(config: dict[str, Any]) -> list[int]:
    return [m * (k // b) for k, b, m in zip(config["block_sizes"], config["kernel_block_sizes"],
                                            config["max_num_blocks_per_group"])]


def block_ids(seed: int, salt: str, shape: tuple[int, ...]) -> np.ndarray:
    """int32 kernel block ids: one in 16 zero, one in 16 at most 7 below 2**31-1, one
    in 16 below 64, the rest anywhere in [0, 2**31-1]."""
    h = pseudo_random_bits(seed, salt, int(np.prod(shape)))
    ids = (h >> np.uint64(16)) % np.uint64(2**31)
    pick = h % np.uint64(16)
    ids = np.where(pick == 0, np.uint64(0), ids)
    ids = np.where(pick == 1, np.uint64(INT32_MAX) - (h >> np.uint64(8)) % np.uint64(8), ids)
    ids = np.where(pick == 2, (h >> np.uint64(8)) % np.uint64(64), ids)
    return ids.astype(np.int64).astype(np.int32).reshape(shape)


def counts(seed: int, salt: str, n: int, width: int) -> np.ndarray:
    """int32 [n]: one in 8 zero, one in 8 the whole width, the rest in [0, width]."""
    h = pseudo_random_bits(seed, salt, n)
    anywhere = (h >> np.uint64(8)) % np.uint64(width + 1)
    pick = h % np.uint64(8)
    return np.where(pick == 0, np.uint64(0), np.where(pick == 1, np.uint64(width), anywhere)).astype(np.int32)


def before(call: dict[str, Any]) -> State:
    """The state before the call, from its seeds."""
    config = call["config"]
    Rmax, Tmax = config["max_num_reqs"], config["max_num_batched_tokens"]
    seeds = call["group_seeds"]
    rows, inp, cnt, cnt_dev, slots = [], [], [], [], []
    for seed, width in zip(seeds, widths(config)):
        rows.append(block_ids(seed, "rows", (Rmax, width)))
        inp.append(block_ids(seed, "inp", (Rmax, width)))
        cnt.append(counts(seed, "cnt", Rmax, width))
        cnt_dev.append(cnt[-1] if call["synced"] else counts(seed, "cnt_dev", Rmax, width))
        slots.append(pseudo_random_bits(seed, "slots", Tmax).view(np.int64))
    G = len(seeds)
    return State(rows, np.array(cnt, dtype=np.int32).reshape(G, Rmax),
                 np.array(cnt_dev, dtype=np.int32).reshape(G, Rmax), inp,
                 np.array(slots, dtype=np.int64).reshape(G, Tmax))


def loaded(call: dict[str, Any], state: State) -> BlockTables:
    """The reference's BlockTables of the call, holding `state`."""
    ref = tables(call["config"])
    for g in range(ref.num_groups):
        ref.rows[g][...] = state.rows[g]
        ref.inp[g][...] = state.inp[g]
    ref.cnt[...] = state.cnt
    ref.cnt_dev[...] = state.cnt_dev
    ref.slots[...] = state.slots
    return ref


def _state(ref: BlockTables) -> State:
    return State([a.copy() for a in ref.rows], ref.cnt.copy(), ref.cnt_dev.copy(), [a.copy() for a in ref.inp],
                 ref.slots.copy())


def idx_mapping(call: dict[str, Any]) -> np.ndarray:
    return np.array(call["idx_mapping"], dtype=np.int64).astype(call["idx_dtype"])


def plan(call: dict[str, Any]) -> Plan:
    """Run the call on the reference. Raises what the reference raises for a call it
    refuses (ValueError, TypeError): such a call is no case."""
    start = before(call)
    ref = loaded(call, start)
    op = call["op"]
    if op == "append":
        origin: list[int] = []
        for j, a in enumerate(call["appends"]):
            staged = len(ref.staged)
            ref.append_block_ids(a["slot"], a["ids"], a["overwrite"])
            origin += [j] * (len(ref.staged) - staged)
        writes = [(g, r, s, list(ids)) for g, r, s, ids in ref.staged]
        cu = np.zeros(len(writes) + 1, dtype=np.int64)
        np.cumsum([len(ids) for *_, ids in writes], out=cu[1:])
        inputs = {"cnt": ref.cnt.copy(),
                  "staged_group": np.array([w[0] for w in writes], dtype=np.int32),
                  "staged_row": np.array([w[1] for w in writes], dtype=np.int32),
                  "staged_start": np.array([w[2] for w in writes], dtype=np.int32),
                  "staged_ids": np.array([i for w in writes for i in w[3]], dtype=np.int64).astype(np.int32),
                  "cu_staged": cu.astype(np.int32)}
        ref.apply_staged_writes()
        return Plan(start, _state(ref), inputs, staged=writes, origin=origin)
    idx = idx_mapping(call)
    if op == "gather":
        ref.gather_block_tables(idx, call["num_reqs_padded"])
        return Plan(start, _state(ref), {"idx_mapping": idx}, call["num_reqs_padded"])
    qsl = np.array(call["query_start_loc"], dtype=np.int64).astype(np.int32)
    positions = np.array(call["positions"], dtype=np.int64)
    ref.compute_slot_mappings(idx, qsl, positions, call["num_tokens_padded"])
    return Plan(start, _state(ref), {"idx_mapping": idx, "query_start_loc": qsl, "positions": positions},
                call["num_tokens_padded"])
