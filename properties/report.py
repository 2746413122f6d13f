"""A discrepancy explained in the user's terms: the configuration, the shrunk step
program, the first differing slot decoded into request, token, position, blocks
and owning rank, the row as each side holds it, where in the plug-in's own code an
exception was raised, and the command that replays it."""

from __future__ import annotations

import functools
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from blocktable.properties.compare import Discrepancy, SlotDiscrepancy
from blocktable.properties.guard import UNWRITTEN

UNWRITTEN_NOTE = "never written by the kernel"


def value_text(value: int) -> str:
    """A slot as reports show it: the value poured into every output before the call
    says so, or it reads like a slot number."""
    return f"{value} ({UNWRITTEN_NOTE})" if int(value) == UNWRITTEN else str(value)


def label_poison(text: str) -> str:
    """`text` with the poured-in value labelled wherever it appears."""
    return text.replace(str(UNWRITTEN), value_text(UNWRITTEN))


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """Folders whose code is not the plug-in's: the standard library, installed
    packages, and blocktable's own four folders."""
    import blocktable
    import blocktable.kernels
    import blocktable.properties
    import blocktable.reference

    roots = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {str(Path(m.__file__).resolve().parent)
              for m in (blocktable, blocktable.kernels, blocktable.properties, blocktable.reference)}
    roots |= {str(Path(sys.prefix) / "lib"), str(Path(sys.base_prefix) / "lib")}
    return tuple(sorted(str(Path(r).resolve()) for r in roots if r))


def is_library_file(filename: str) -> bool:
    if filename.startswith("<"):  # frozen import machinery, exec'd strings
        return True
    resolved = str(Path(filename).resolve())
    return any(resolved == root or resolved.startswith(root + "/") for root in _library_roots())


def exception_chain(error: BaseException) -> list[BaseException]:
    """`error`, then what it was raised from (or during), outermost first."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return chain


def plugin_frames(error: BaseException, kernel_files: Iterable[str] = ()) -> list[traceback.FrameSummary]:
    """The frames of `error`'s chain in the plug-in's own code (files outside the
    standard library, installed packages and blocktable, and `kernel_files`), in
    call order, each once."""
    own = {str(Path(f).resolve()) for f in kernel_files}
    frames, seen = [], set()
    for exc in reversed(exception_chain(error)):  # the innermost cause holds the plug-in's frames
        for frame in traceback.extract_tb(exc.__traceback__):
            key = (frame.filename, frame.lineno, frame.name)
            if key in seen:
                continue
            if str(Path(frame.filename).resolve()) in own or not is_library_file(frame.filename):
                seen.add(key)
                frames.append(frame)
        if isinstance(exc, SyntaxError) and exc.filename and not is_library_file(exc.filename):
            frames.append(traceback.FrameSummary(exc.filename, exc.lineno or 0, "<module>", line=(exc.text or "").strip()))
    return frames


def where_text(error: BaseException, kernel_files: Iterable[str] = ()) -> str:
    """The innermost plug-in frame as " (at FILE:LINE)", for one-line messages."""
    frames = plugin_frames(error, kernel_files)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def exception_lines(error: BaseException, kernel_files: Iterable[str] = (), verbose: bool = False) -> list[str]:
    """Where in the plug-in's code the exception came from; with `verbose`, the whole
    chain as Python prints it."""
    lines = []
    frames = plugin_frames(error, kernel_files)
    if frames:
        raised = next((e for e in reversed(exception_chain(error)) if e.__traceback__ is not None), error)
        lines.append(f"  raised in the plug-in's code ({type(raised).__name__}; innermost call last):")
        for frame in frames:
            lines.append(f"    {frame.filename}:{frame.lineno} in {frame.name}")
            if frame.line:
                lines.append(f"        {frame.line.strip()}")
    if verbose and (error.__cause__ is not None or error.__context__ is not None or frames):
        lines.append("  the whole exception chain:")
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        lines.extend(f"    {line}" for line in text.rstrip().splitlines())
    return lines


def amend(report: str, title: str | None = None, lines: Iterable[str] = ()) -> str:
    """A rendered report with a new first line and `lines` added before its replay line."""
    rows = report.splitlines()
    if title and rows:
        rows[0] = title
    at = next((i for i in range(len(rows) - 1, -1, -1) if rows[i].startswith("replay: ")), len(rows))
    return "\n".join(rows[:at] + list(lines) + rows[at:])


def describe_step(step: dict[str, Any]) -> str:
    args = " ".join(f"{k}={v}" for k, v in step.items() if k != "op")
    return f"{step['op']} {args}".rstrip()


def decode_token(t: int, qsl: np.ndarray, positions: np.ndarray, table: np.ndarray,
                 config: dict[str, int]) -> dict[str, Any]:
    """Where token t of a slot-mapping call lands, by docs/contract.md §4's arithmetic."""
    T = len(positions)
    if t >= T:
        return {"token": t, "tail": True}
    K, B = config["kv_block_size"], config["kernel_block_size"]
    W, R, I = config.get("cp_world_size", 1), config.get("cp_rank", 0), config.get("cp_interleave", 1)
    P = K // B
    r = int(np.searchsorted(qsl, t, side="right")) - 1
    p = int(positions[t])
    VB = K * W
    vbi, vbo = p // VB, p % VB
    owner = (vbo // I) % W
    lofs = (vbo // (W * I)) * I + vbo % I
    col = vbi * P + lofs // B
    width = table.shape[1]
    physical = int(table[r, col]) if col < width and r < table.shape[0] else None
    return {"token": t, "tail": False, "request_row": r, "position": p, "logical_block": vbi,
            "offset_in_block": vbo, "owner": owner, "rank": R, "local_offset": lofs, "column": col,
            "width": width, "physical": physical, "P": P}


def _row_text(row: np.ndarray, count: int | None = None, limit: int = 16) -> str:
    shown = ", ".join(str(int(x)) for x in row[:limit])
    more = f", … ({len(row)} entries)" if len(row) > limit else ""
    return f"[{shown}{more}]" + (f" count {count}" if count is not None else "")


def slot_lines(error: SlotDiscrepancy, impl_table: np.ndarray | None = None,
               ref_count: int | None = None, impl_count: int | None = None) -> list[str]:
    expected, actual = error.expected_mapping, error.actual_mapping
    differ = np.flatnonzero(expected != actual)
    lines = []
    if not len(differ):
        return [f"  {error}"]
    t = int(differ[0])
    d = decode_token(t, error.query_start_loc, error.positions, error.table, error.config)
    lines.append("  first differing element:")
    if d["tail"]:
        lines.append(f"    token {t} lies in the tail [T={len(error.positions)}, Tmax={len(expected)}): "
                     f"expected -1, got {value_text(actual[t])}")
    else:
        rid = error.requests[d["request_row"]] if d["request_row"] < len(error.requests) else None
        who = f"request {rid} (row {d['request_row']})" if rid is not None else f"row {d['request_row']}"
        lines.append(f"    {who}, token {t}, position {d['position']}")
        lines.append(f"    logical allocation block {d['logical_block']}, offset {d['offset_in_block']} of "
                     f"{error.config['kv_block_size'] * error.config.get('cp_world_size', 1)}; owned by rank "
                     f"{d['owner']} (this call is rank {d['rank']}); local offset {d['local_offset']}")
        if d["physical"] is None:
            lines.append(f"    table column {d['column']} lies past the row (width {d['width']}): the slot must be -1")
        else:
            lines.append(f"    table column {d['column']} (kernel block), physical kernel block {d['physical']} "
                         f"(allocation block {d['physical'] // d['P'] if d['physical'] >= 0 else '?'})")
        lines.append(f"    expected slot {int(expected[t])}, actual slot {value_text(actual[t])}")
        r = d["request_row"]
        if r < error.table.shape[0]:
            lines.append(f"  row {r} as the reference holds it:      {_row_text(error.table[r], ref_count)}")
            if impl_table is not None:
                lines.append(f"  row {r} as the implementation holds it: {_row_text(impl_table[r], impl_count)}")
    tokens = ", ".join(str(int(x)) for x in differ[:8]) + (" …" if len(differ) > 8 else "")
    lines.append(f"  differing elements: {len(differ)} of {len(expected)} (tokens {tokens})")
    return lines


def render(*, kernel: str, device: str, error: BaseException | None, config_text: str,
           program: list[dict[str, Any]] | None, failed_step: int | None, replay_command: str | None,
           run: Any = None, triage: str | None = None, title: str = "blocktable found a discrepancy",
           kernel_files: Iterable[str] = (), verbose: bool = False) -> str:
    lines = [title, f"  kernel:  {kernel}", f"  device:  {device}", f"  config:  {config_text}"]
    if program is not None:
        lines.append(f"  program ({len(program)} steps):")
        for i, step in enumerate(program):
            mark = "  <- fails here" if failed_step == i else ""
            lines.append(f"    {i + 1:3d}. {describe_step(step)}{mark}")
    if error is not None:
        where = f" at step {failed_step + 1}" if failed_step is not None else ""
        lines.append(label_poison(f"  failure{where}: {type(error).__name__}: {error}"))
        lines.extend(exception_lines(error, kernel_files, verbose))
    if isinstance(error, SlotDiscrepancy):
        impl_table = ref_count = impl_count = None
        if run is not None:
            impl_table = run.tables[error.group].device_rows()
            r = int(np.searchsorted(error.query_start_loc, int(np.argmax(error.expected_mapping != error.actual_mapping)),
                                    side="right")) - 1
            if 0 <= r < impl_table.shape[0]:
                ref_count = int(run.ref_tables[error.group].count[r])
                impl_count = int(run.tables[error.group].count[r])
        lines.extend(slot_lines(error, impl_table, ref_count, impl_count))
    elif isinstance(error, Discrepancy) and error.index is not None and run is not None and "table" in error.what:
        group = int(error.what.split()[1]) if error.what.startswith("group ") else 0
        row = error.index[0]
        ref, impl = run.ref_tables[group], run.tables[group]
        source = "device" if "device" in error.what else "host"
        ref_rows = ref.device if source == "device" else ref.host
        impl_rows = impl.device_rows() if source == "device" else impl.host
        lines.append(f"  row {row} ({source}) as the reference holds it:      "
                     f"{_row_text(ref_rows[row], int(ref.count[row]))}")
        lines.append(f"  row {row} ({source}) as the implementation holds it: "
                     f"{_row_text(impl_rows[row], int(impl.count[row]))}")
    if triage:
        lines.append(f"  triage: {triage}")
    if replay_command:
        lines.append(f"replay: {replay_command}")
    return "\n".join(lines)
