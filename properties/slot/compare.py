"""A slot mapping compared whole with the reference's, and a difference decoded by
docs/contract.md §4's arithmetic into request, token, position, blocks and owning rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from blocktable.properties.compare import Discrepancy, same_values


@dataclass(frozen=True)
class DecodedToken:
    """Where token `token` of a slot-mapping call lands, by §4's arithmetic. A token in
    the tail [T, Tmax) has no request: `tail` is True and the rest is unset."""

    token: int
    tail: bool
    request_row: int = -1
    position: int = -1
    logical_block: int = -1
    offset_in_block: int = -1
    owner: int = -1  # the rank that owns the position
    rank: int = 0  # the rank this call is for
    local_offset: int = -1
    column: int = -1
    width: int = 0
    physical: int | None = None  # the table entry at (row, column); None: past the row
    P: int = 1


def decode_token(t: int, qsl: np.ndarray, positions: np.ndarray, table: np.ndarray,
                 config: dict[str, int]) -> DecodedToken:
    if t >= len(positions):
        return DecodedToken(t, True)
    K, B = config["kv_block_size"], config["kernel_block_size"]
    W, R, I = config.get("cp_world_size", 1), config.get("cp_rank", 0), config.get("cp_interleave", 1)
    P = K // B
    r = int(np.searchsorted(qsl, t, side="right")) - 1
    p = int(positions[t])
    VB = K * W
    vbi, vbo = p // VB, p % VB
    lofs = (vbo // (W * I)) * I + vbo % I
    col = vbi * P + lofs // B
    width = table.shape[1]
    physical = int(table[r, col]) if col < width and r < table.shape[0] else None
    return DecodedToken(t, False, r, p, vbi, vbo, (vbo // I) % W, R, lofs, col, width, physical, P)


class SlotDiscrepancy(Discrepancy):
    """A slot mapping differs. Carries the call (configuration, inputs, the table as
    the reference holds it and, in a lockstep run, as the implementation does), both
    mappings, and the first differing token decoded (`first`, None when only the
    shape or dtype differs)."""

    def __init__(self, part: str, message: str, *, group: int | None, rank: int | None, config: dict[str, int],
                 query_start_loc: np.ndarray, positions: np.ndarray, table: np.ndarray, expected: np.ndarray,
                 actual: np.ndarray, requests: list[int | None], impl_table: np.ndarray | None = None,
                 counts: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        super().__init__(part, message, group=group, rank=rank)
        self.config = config
        self.query_start_loc = query_start_loc
        self.positions = positions
        self.table = table.copy()  # snapshots: the caller's tables move on with its run
        self.impl_table = None if impl_table is None else impl_table.copy()
        self.counts = None if counts is None else (counts[0].copy(), counts[1].copy())  # (reference's, ours)
        self.expected_mapping = expected
        self.actual_mapping = actual
        self.requests = requests
        differ = np.flatnonzero(expected != actual) if expected.shape == actual.shape else np.zeros(0, np.int64)
        self.differing = differ
        self.first = decode_token(int(differ[0]), query_start_loc, positions, table, config) if len(differ) else None


def check_slot_mapping(part: str, expected: np.ndarray, actual: np.ndarray, **context: Any) -> None:
    """Raise SlotDiscrepancy unless `actual` equals `expected` whole (shape, dtype,
    every element of [Tmax]). `context`: SlotDiscrepancy's keywords."""
    if expected.shape == actual.shape and expected.dtype == actual.dtype and same_values(expected, actual):
        return
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        message = f"shape/dtype {actual.shape} {actual.dtype}, expected {expected.shape} {expected.dtype}"
    else:
        differ = np.flatnonzero(expected != actual)
        t = int(differ[0])
        message = (f"{len(differ)} of {len(expected)} slots differ; first at token {t}: "
                   f"expected {expected[t]}, got {actual[t]}")
    raise SlotDiscrepancy(part, message, expected=expected, actual=actual, **context)


def first_difference(error: BaseException | None) -> list[int] | None:
    """(token, expected, actual) of a slot discrepancy's first difference, for triage."""
    if isinstance(error, SlotDiscrepancy) and error.first is not None:
        t = error.first.token
        return [t, int(error.expected_mapping[t]), int(error.actual_mapping[t])]
    return None
