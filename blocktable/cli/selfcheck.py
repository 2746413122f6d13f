"""`blocktable selfcheck`: the reference model against the contract's worked examples (docs/contract.md).

Quick proof that an installation's reference agrees with the contract before it is
used as the truth: every §4 example, §6's design-notes picture, and a §7 round trip
through the paged-cache model on every DCP rank.
"""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.table import Table

from blocktable.properties.slot.examples import SPEC_EXAMPLES
from blocktable.reference import BlockPool, InvariantError, PagedCache, slot_mapping
from blocktable.reference.oracle import POISON


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selfcheck",
                       help="check the reference model against the contract's worked examples (docs/contract.md)")
    p.set_defaults(run=run)


def _slot_examples() -> list[tuple[str, bool, str]]:
    rows = []
    for ex in SPEC_EXAMPLES:
        qsl, pos, table = ex.inputs()
        got = slot_mapping(qsl, pos, table, ex.tmax, **ex.kwargs())
        want = ex.expected_mapping()
        ok = np.array_equal(got, want)
        detail = "" if ok else f"first difference at token {int(np.argmax(got != want))}"
        rows.append((ex.name, ok, detail))
    return rows


def _design_notes() -> tuple[str, bool, str]:
    tables = [[0, 1, 5], [2, 1], [4, 5, 7]]
    verdicts: list[int | None] = []
    for ref5 in (1, 2):
        pool = BlockPool(8, null_block=False)
        pool.ref = np.array([1, 2, 1, 0, 1, ref5, 0, 1], dtype=np.int64)
        pool.queue = [3, 6]
        try:
            pool.check_invariants(tables)
            verdicts.append(None)
        except InvariantError as e:
            verdicts.append(e.block)
    ok = verdicts == [5, None]
    return "spec6-design-notes", ok, "" if ok else f"verdicts {verdicts}"


def _round_trip() -> tuple[str, bool, str]:
    K, B, W, I, n = 32, 16, 4, 8, 300
    row = np.arange(2, 2 + 2 * 8, dtype=np.int32)[None, :]
    qsl = np.array([0, n], np.int32)
    positions = np.arange(n, dtype=np.int64)
    values = np.arange(1000, 1000 + n, dtype=np.int64)
    merged = np.full(n, POISON, np.int64)
    twice = 0
    for rank in range(W):
        kw = dict(kv_block_size=K, kernel_block_size=B, cp_world_size=W, cp_rank=rank, cp_interleave=I)
        cache = PagedCache(20 * K)
        cache.write(slot_mapping(qsl, positions, row, n, **kw), values)
        got = cache.gather(row[0], n, **kw)
        twice += int(((got != POISON) & (merged != POISON)).sum())
        merged = np.where(got != POISON, got, merged)
    ok = twice == 0 and np.array_equal(merged, values)
    return "spec7-dcp-round-trip", ok, "" if ok else f"{twice} tokens on two ranks"


def run(args: argparse.Namespace) -> int:
    console = Console()
    results = _slot_examples() + [_design_notes(), _round_trip()]
    table = Table(title="reference self-check against docs/contract.md")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for name, ok, detail in results:
        table.add_row(name, "[green]ok[/]" if ok else "[red]FAIL[/]", detail)
    console.print(table)
    failed = sum(not ok for _, ok, _ in results)
    console.print(f"{len(results) - failed}/{len(results)} checks passed")
    return 1 if failed else 0
