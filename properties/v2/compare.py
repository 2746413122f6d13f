"""A V2 buffer's first differing element, decoded in the block tables' terms
(docs/contract.md §10): the group, the persistent row (slot), the batch index, the
column, the request, the token and its position, and what the contract says the
element must hold there and why. It rides on the Discrepancy as its `detail`
(properties/compare.py); report/describe.py renders it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from blocktable.properties.compare import assert_arrays_equal
from blocktable.properties.v2.truth import Plan, widths


@dataclass(frozen=True)
class V2Element:
    """One element of rows, cnt_dev, inp or slots. Fields that do not apply are None."""

    buffer: str  # "rows", "cnt_dev", "inp" or "slots"
    group: int
    expected: int
    actual: int
    slot: int | None = None  # the persistent row r
    batch: int | None = None  # the batch index b (a row of inp; the request a token belongs to)
    column: int | None = None
    token: int | None = None
    position: int | None = None
    why: str = ""  # what the contract says this element must hold, and why


def checker(part: str, group: int | None, detail: Callable[[tuple[int, ...], int, int], V2Element]) -> Callable:
    """A check for kv/guard.run_guarded: the whole view bit for bit, the first
    differing element decoded by `detail(index, expected, actual)`."""
    def check(expected: np.ndarray, actual: np.ndarray) -> None:
        assert_arrays_equal(part, expected, actual, group=group,
                            detail=lambda i: detail(i, int(expected[i]), int(actual[i])))
    return check


# -- append: rows and cnt_dev -------------------------------------------------------------


def _write_text(call: dict[str, Any], plan: Plan, i: int) -> str:
    g, r, start, ids = plan.staged[i]
    j = plan.origin[i]
    a = call["appends"][j]
    how = "overwrite, so from column 0" if a["overwrite"] else "from the host count"
    return f"staged write {i} (append {j} to slot {r}, {how}: columns {start}..{start + len(ids) - 1})"


def append_rows(call: dict[str, Any], plan: Plan, g: int) -> Callable[[tuple[int, ...], int, int], V2Element]:
    def detail(index: tuple[int, ...], expected: int, actual: int) -> V2Element:
        r, c = index
        covering = [i for i, (wg, wr, start, ids) in enumerate(plan.staged)
                    if wg == g and wr == r and start <= c < start + len(ids)]
        count = int(plan.before.cnt_dev[g, r])
        if covering:
            why = f"{_write_text(call, plan, covering[-1])} puts {expected} here (cnt_dev was {count})"
            if len(covering) > 1:
                why += (f"; it is the last of the writes {', '.join(map(str, covering))} that cover this column, "
                        f"and the later one wins")
        else:
            kind = "an entry below the device count" if c < count else "a stale entry past the count"
            why = f"no staged write covers it: {kind} ({count}), it must keep what it held"
        return V2Element("rows", g, expected, actual, slot=r, column=c, why=why)
    return detail


def append_counts(plan: Plan) -> Callable[[tuple[int, ...], int, int], V2Element]:
    def detail(index: tuple[int, ...], expected: int, actual: int) -> V2Element:
        g, r = index
        was = int(plan.before.cnt_dev[g, r])
        return V2Element("cnt_dev", g, expected, actual, slot=r,
                         why=f"cnt_dev becomes the host count {expected} (it was {was}): the apply's snapshot")
    return detail


# -- gather: inp --------------------------------------------------------------------------


def gather_rows(call: dict[str, Any], plan: Plan, g: int) -> Callable[[tuple[int, ...], int, int], V2Element]:
    idx, padded = call["idx_mapping"], call["num_reqs_padded"]

    def detail(index: tuple[int, ...], expected: int, actual: int) -> V2Element:
        b, c = index
        N = len(idx)
        if b >= padded:
            return V2Element("inp", g, expected, actual, batch=b, column=c,
                             why=f"a row past num_reqs_padded {padded}: it must not change")
        if b >= N:
            return V2Element("inp", g, expected, actual, batch=b, column=c,
                             why=f"padding (N = {N} <= b < num_reqs_padded {padded}): the whole row is 0")
        r = idx[b]
        if r < 0:
            return V2Element("inp", g, expected, actual, batch=b, slot=-1, column=c,
                             why="a dummy (idx_mapping -1): the whole row is 0")
        n = int(plan.before.cnt_dev[g, r])
        why = (f"copied from column {c} of slot {r} (cnt_dev {n})" if c < n else
               f"stale: column {c} is past slot {r}'s cnt_dev {n}, so it keeps what it held")
        return V2Element("inp", g, expected, actual, batch=b, slot=r, column=c, why=why)
    return detail


# -- slots --------------------------------------------------------------------------------


def token_rule(config: dict[str, Any], g: int, p: int) -> tuple[bool, int, int, str]:
    """(local, l, col, how): §10.7's reading of position p in group g, in words."""
    K, B = config["block_sizes"][g], config["kernel_block_sizes"][g]
    W, R, I = config["cp_size"], config["cp_rank"], config["cp_interleave"]
    if config["dcp_sharded"][g] and W > 1:
        VB = K * W
        vbi, vbo = divmod(p, VB)
        owner = (vbo // I) % W
        l = vbi * K + (vbo // (W * I)) * I + vbo % I
        how = (f"virtual block {vbi}, offset {vbo} of K*W = {VB}, owned by rank {owner} (this is rank {R})")
        return owner == R, l, l // B, how + (f"; local position {l}" if owner == R else "")
    return True, p, p // B, "replicated" if W > 1 else "no DCP"


def slot_entries(call: dict[str, Any], plan: Plan) -> Callable[[tuple[int, ...], int, int], V2Element]:
    config = call["config"]
    idx, qsl, positions = call["idx_mapping"], call["query_start_loc"], call["positions"]
    N = len(idx)
    T = qsl[N]
    width = widths(config)

    def detail(index: tuple[int, ...], expected: int, actual: int) -> V2Element:
        g, t = index
        if t >= T:
            return V2Element("slots", g, expected, actual, token=t,
                             why=f"the pad: token {t} is past T = query_start_loc[N] = {T}, so -1 "
                                 f"(to the end of the buffer, past num_tokens_padded {call['num_tokens_padded']})")
        b = int(np.searchsorted(np.array(qsl[1:N + 1]), t, side="right"))
        r, p = idx[b], positions[t]
        if not config["slot_mapping_enabled"][g]:
            return V2Element("slots", g, expected, actual, token=t, position=p, batch=b, slot=r,
                             why="the group is disabled: -1")
        if r < 0:
            return V2Element("slots", g, expected, actual, token=t, position=p, batch=b, slot=r,
                             why="a dummy's token: -1")
        local, l, col, how = token_rule(config, g, p)
        B = config["kernel_block_sizes"][g]
        if not local:
            why = f"{how}: not this rank's, -1"
        elif col >= width[g]:
            why = f"{how}; column {col} is past the row (width {width[g]}): -1"
        else:
            block = int(plan.before.rows[g][r, col])
            why = f"{how}; kernel block id {block} at column {col}: {block} * {B} + {l % B} = {block * B + l % B}"
        return V2Element("slots", g, expected, actual, token=t, position=p, batch=b, slot=r,
                         column=col if local else None, why=why)
    return detail
