"""The harness's things in words, one line or a few each: a step, a slot-mapping,
KV or V2 block-table call, a case's world or call, the command that replays it, a
whole run, and a failure's decoded element (a slot mapping's first differing token,
a table's differing row, a V2 buffer's element). Reports (report/report.py) are made
of these."""

from __future__ import annotations

from typing import Any

import numpy as np

from blocktable.plugin import replaces_slot_kernel
from blocktable.properties.cases.case import Case
from blocktable.properties.compare import Discrepancy
from blocktable.properties.kv.call import cache_dtype
from blocktable.properties.lockstep.check import TableRows
from blocktable.properties.report.frames import exception_lines
from blocktable.properties.slot.compare import SlotDiscrepancy
from blocktable.properties.slot.guard import UNWRITTEN
from blocktable.properties.v2.compare import V2Element

UNWRITTEN_NOTE = "never written by the kernel"


def value_text(value: int) -> str:
    """A slot as reports show it: the value poured into every output before the call
    says so, or it reads like a slot number."""
    return f"{value} ({UNWRITTEN_NOTE})" if int(value) == UNWRITTEN else str(value)


def label_poison(text: str) -> str:
    """`text` with the poured-in value labelled wherever it appears."""
    return text.replace(str(UNWRITTEN), value_text(UNWRITTEN))


def describe_step(step: dict[str, Any]) -> str:
    args = " ".join(f"{k}={v}" for k, v in step.items() if k != "op")
    return f"{step['op']} {args}".rstrip()


def config_text(name: str, config: dict[str, int], requests: int, tokens: int, max_num_tokens: int | None) -> str:
    """One slot-mapping call's configuration and size."""
    c = config
    return (f"{name}: K={c.get('kv_block_size')} B={c.get('kernel_block_size')} "
            f"W={c.get('cp_world_size', 1)} R={c.get('cp_rank', 0)} I={c.get('cp_interleave', 1)}, "
            f"{requests} requests, {tokens} tokens, Tmax {max_num_tokens}")


def slot_call_text(call: dict[str, Any]) -> str:
    return config_text(call.get("name", "call"), call.get("config", {}), len(call.get("query_start_loc", [0])) - 1,
                       len(call.get("positions", [])), call.get("max_num_tokens"))


def kv_call_text(call: dict[str, Any]) -> str:
    """One KV call (kv/call.py), one line."""
    c = call
    data = f"{c['dtype']} into {cache_dtype(c)} ({c['kv_cache_dtype']}"
    data += f", k_scale {c['k_scale']!r}, v_scale {c['v_scale']!r})" if c["kv_cache_dtype"] != "auto" else ")"
    form = c["cache_form"]
    caches = ("caches are halves of one tensor" if form["joint"] else "separate caches") + \
        (f", head rows padded by {form['pad']}" if form["pad"] else "")
    head = (f"kv-{c['op']} {c.get('name', '')}: {c['layout']}, {c['num_blocks']} blocks of {c['block_size']}, "
            f"H={c['num_heads']}, D={c['head_size']}, {data}, {caches}")
    if c["op"] == "write":
        n = len(c["slot_mapping"])
        joint = ", key and value slices of one qkv tensor" if c["input_form"]["joint"] else ""
        return f"{head}; {n} tokens ({c['rows'] - n} padding rows{joint})"
    if c["op"] == "copy":
        return f"{head}; {c['layers']} layers, {len(c['block_mapping'])} pairs"
    N = len(c["cu_lens"]) - 1
    return f"{head}; {N} requests, {c['cu_lens'][-1]} tokens, {c['out_rows']} output rows"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def v2_call_text(call: dict[str, Any]) -> str:
    """One V2 block-table call (v2/call.py), one line."""
    c = call["config"]
    groups = ", ".join(
        f"K={k} B={b} M={m}{'' if s else ' replicated'}{'' if e else ' disabled'}"
        for k, b, m, s, e in zip(c["block_sizes"], c["kernel_block_sizes"], c["max_num_blocks_per_group"],
                                 c["dcp_sharded"], c["slot_mapping_enabled"]))
    dcp = f", DCP W={c['cp_size']} R={c['cp_rank']} I={c['cp_interleave']}" if c["cp_size"] > 1 else ""
    head = (f"v2-{call['op']} {call.get('name', '')}: {_count(len(c['block_sizes']), 'group')} ({groups}), "
            f"Rmax {c['max_num_reqs']}, Tmax {c['max_num_batched_tokens']}{dcp}")
    if call["op"] == "append":
        appends = call["appends"]
        overwrites = sum(a["overwrite"] for a in appends)
        return (f"{head}; {_count(len(appends), 'append')} ({_count(overwrites, 'overwrite')}) to "
                f"{_count(len({a['slot'] for a in appends}), 'slot')}")
    N = len(call["idx_mapping"])
    dummies = sum(r < 0 for r in call["idx_mapping"])
    batch = f"{_count(N, 'batch position')} ({dummies} -1 dummies, {call['idx_dtype']} idx_mapping)"
    if call["op"] == "gather":
        return f"{head}; {batch}, num_reqs_padded {call['num_reqs_padded']}"
    T = call["query_start_loc"][N]
    return f"{head}; {batch}, {T} tokens, num_tokens_padded {call['num_tokens_padded']}"


def case_config(case: Case) -> str:
    """The case's world or call, one line."""
    if case.kind == "kv-call":
        return kv_call_text(case.call or {})
    if case.kind == "v2-call":
        return v2_call_text(case.call or {})
    return case.world.describe() if case.world else slot_call_text(case.call or {})


def case_kernels(case: Case) -> str:
    """What the case ran: its kernel and the KV, V2 and class plug-ins it named."""
    if case.kind == "v2-call":
        return f"v2-{(case.call or {}).get('op')} {case.kernel}"
    kernel = [] if replaces_slot_kernel(case.classes) else [case.kernel]
    return "; ".join([*kernel, *(f"kv-{kind} {spec}" for kind, spec in case.kv.items()),
                      *(f"v2-{kind} {spec}" for kind, spec in case.v2.items()),
                      *(f"{kind} {spec}" for kind, spec in case.classes.items())])


def replay_command(case_path: Any, kernel: str, device_name: str, flags: list[str] | None = None,
                   flag: str | None = "--kernel") -> str:
    """The whole command: every plug-in the case ran with is named, so that editing
    one spec points the replay at a fix. `flag` None: the case ran no kernel of its own."""
    named = [f"{flag} {kernel}"] if flag else []
    return " ".join([f"blocktable replay {case_path}", *named, *(flags or []), f"--device {device_name}"])


def kernel_flag(case: Case) -> str | None:
    """The replay flag that names the case's kernel: a v2-call's is its op's --v2-* flag;
    None for a case with a table class, which computes its own slot mappings."""
    if case.kind == "v2-call":
        return f"--v2-{(case.call or {}).get('op')}"
    return None if replaces_slot_kernel(case.classes) else "--kernel"


def whole_run_text(whole: dict[str, Any]) -> str:
    """A whole run as reports name it: "8 contract examples, then 12 programs (340 steps)"."""
    programs = whole.get("programs", [])
    steps = sum(len(p.get("program", [])) for p in programs)
    examples = whole.get("contract_examples", 0)
    parts = [f"{examples} contract example{'s' if examples != 1 else ''}"] if examples else []
    if programs:
        parts.append(f"{len(programs)} program{'s' if len(programs) != 1 else ''} ({steps} steps)")
    dropped = whole.get("dropped", 0)
    return ", then ".join(parts) + (f"; the {dropped} programs before those are not kept" if dropped else "")


def _row_text(row: np.ndarray, count: int | None = None, limit: int = 16) -> str:
    shown = ", ".join(str(int(x)) for x in row[:limit])
    more = f", … ({len(row)} entries)" if len(row) > limit else ""
    return f"[{shown}{more}]" + (f" count {count}" if count is not None else "")


def slot_lines(error: SlotDiscrepancy) -> list[str]:
    """The first differing token decoded, the row as each side holds it, and which
    tokens differ."""
    d = error.first
    if d is None:
        return [f"  {error}"]
    expected, actual = error.expected_mapping, error.actual_mapping
    t = d.token
    lines = ["  first differing element:"]
    if d.tail:
        lines.append(f"    token {t} lies in the tail [T={len(error.positions)}, Tmax={len(expected)}): "
                     f"expected -1, got {value_text(actual[t])}")
    else:
        rid = error.requests[d.request_row] if d.request_row < len(error.requests) else None
        who = f"request {rid} (row {d.request_row})" if rid is not None else f"row {d.request_row}"
        lines.append(f"    {who}, token {t}, position {d.position}")
        lines.append(f"    logical allocation block {d.logical_block}, offset {d.offset_in_block} of "
                     f"{error.config['kv_block_size'] * error.config.get('cp_world_size', 1)}; owned by rank "
                     f"{d.owner} (this call is rank {d.rank}); local offset {d.local_offset}")
        if d.physical is None:
            lines.append(f"    table column {d.column} lies past the row (width {d.width}): the slot must be -1")
        else:
            lines.append(f"    table column {d.column} (kernel block), physical kernel block {d.physical} "
                         f"(allocation block {d.physical // d.P if d.physical >= 0 else '?'})")
        lines.append(f"    expected slot {int(expected[t])}, actual slot {value_text(actual[t])}")
        r = d.request_row
        if r < error.table.shape[0]:
            counts = error.counts
            ref_count = int(counts[0][r]) if counts is not None and r < len(counts[0]) else None
            impl_count = int(counts[1][r]) if counts is not None and r < len(counts[1]) else None
            lines.append(f"  row {r} as the reference holds it:      {_row_text(error.table[r], ref_count)}")
            if error.impl_table is not None and r < error.impl_table.shape[0]:
                lines.append(f"  row {r} as the implementation holds it: {_row_text(error.impl_table[r], impl_count)}")
    differ = error.differing
    tokens = ", ".join(str(int(x)) for x in differ[:8]) + (" …" if len(differ) > 8 else "")
    lines.append(f"  differing elements: {len(differ)} of {len(expected)} (tokens {tokens})")
    return lines


def v2_where(d: V2Element) -> str:
    """"group 1, batch index 2, slot 17, column 5"."""
    parts = [f"group {d.group}"]
    if d.token is not None:
        parts.append(f"token {d.token}" + (f" (position {d.position})" if d.position is not None else ""))
    if d.batch is not None:
        parts.append(f"request at batch index {d.batch}" if d.buffer == "slots" else f"batch index {d.batch}")
    if d.slot is not None:
        parts.append(f"slot {d.slot}" if d.slot >= 0 else "a dummy (slot -1)")
    if d.column is not None:
        parts.append(f"column {d.column}")
    return ", ".join(parts)


def v2_lines(d: V2Element) -> list[str]:
    """A V2 buffer's first differing element: where, why, and both values."""
    return ["  first differing element:", f"    {d.buffer} of {v2_where(d)}", f"    {d.why}",
            f"    expected {d.expected}, got {d.actual}"]


def table_lines(rows: TableRows) -> list[str]:
    row, source = rows.row, rows.source
    return [f"  row {row} ({source}) as the reference holds it:      {_row_text(rows.rows[0], rows.counts[0])}",
            f"  row {row} ({source}) as the implementation holds it: {_row_text(rows.rows[1], rows.counts[1])}"]


def failure_lines(error: BaseException | None, failed_step: int | None, kernel_files: list[str],
                  verbose: bool) -> list[str]:
    """What failed, where in the plug-in's code it was raised, and the differing
    element decoded."""
    if error is None:
        return []
    where = f" at step {failed_step + 1}" if failed_step is not None else ""
    lines = [label_poison(f"  failure{where}: {type(error).__name__}: {error}")]
    lines.extend(exception_lines(error, kernel_files, verbose))
    if isinstance(error, SlotDiscrepancy):
        lines.extend(slot_lines(error))
    elif isinstance(error, Discrepancy) and isinstance(error.detail, TableRows):
        lines.extend(table_lines(error.detail))
    elif isinstance(error, Discrepancy) and isinstance(error.detail, V2Element):
        lines.extend(v2_lines(error.detail))
    return lines
