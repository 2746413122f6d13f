"""`blocktable fuzz --stateless --kv-write/--kv-copy/--kv-gather SPEC`: each KV kernel
named (docs/contract.md §9) alone, on random calls (properties/kv_draw.py) run behind
guards and compared whole, bit for bit, with the truth (properties/kv_calls.py).

The kinds named take turns, one call each; `--examples N` is N calls of each. A
failing call is shrunk to the smallest of: the failing token (pair, request) alone,
its neighbourhood, the whole call, that still fails, and saved as a "kv-call" case
file that `blocktable replay` runs again.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from blocktable.properties.case import Case, provenance
from blocktable.properties.engine import Send, prepare_backend, prepare_kv, send_failure
from blocktable.properties.journal import Journal
from blocktable.properties.kv_calls import call_text, run_kv_call
from blocktable.properties.kv_draw import draw
from blocktable.properties.messages import Job, Progress, Result, Stats

NEIGHBOURHOOD = 8  # tokens (pairs, requests) on each side of the failing one


def named_kinds(job: Job) -> list[tuple[str, str]]:
    """(kind, spec) of every KV kernel the job names, in a fixed order."""
    specs = {"write": job.kv_write, "copy": job.kv_copy, "gather": job.kv_gather}
    return [(kind, spec) for kind, spec in specs.items() if spec is not None]


def call_size(call: dict[str, Any]) -> int:
    """Tokens written, pairs copied or rows gathered: what the progress line counts."""
    if call["op"] == "write":
        return len(call["slot_mapping"])
    if call["op"] == "copy":
        return len(call["block_mapping"]) * call["layers"]
    return call["cu_lens"][-1]


def _write_part(call: dict[str, Any], tokens: list[int], name: str) -> dict[str, Any]:
    """The call cut to `tokens` (in order), the padding rows kept behind them."""
    n, rows = len(call["slot_mapping"]), call["rows"]
    keep = list(tokens) + list(range(n, rows))
    part = dict(call, name=name, slot_mapping=[call["slot_mapping"][t] for t in tokens], rows=len(keep))
    for v in ("key", "value"):
        data = np.array(call[v], dtype=np.uint64).reshape(rows, -1)
        part[v] = data[keep].reshape(-1).tolist()
    return part


def _gather_part(call: dict[str, Any], requests: list[int], name: str) -> dict[str, Any]:
    """The call cut to `requests`, packed from row 0, with the same spare output rows."""
    cu = call["cu_lens"]
    lengths = [cu[r + 1] - cu[r] for r in requests]
    new_cu = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(int).tolist()
    spare = call["out_rows"] - cu[-1]
    return dict(call, name=name, block_table=[call["block_table"][r] for r in requests], cu_lens=new_cu,
                out_rows=new_cu[-1] + spare)


def _around(i: int, count: int) -> list[int]:
    return list(range(max(0, i - NEIGHBOURHOOD), min(count, i + NEIGHBOURHOOD + 1)))


def candidates(call: dict[str, Any], error: BaseException | None) -> list[dict[str, Any]]:
    """Smaller calls to try, smallest first; the whole call last."""
    op = call["op"]
    index = getattr(error, "index", None)
    out: list[dict[str, Any]] = []
    if op == "write":
        slots = call["slot_mapping"]
        slot = getattr(error, "slot", None)
        t = slots.index(slot) if slot in slots else 0
        if slots:
            out += [_write_part(call, [t], "stateless-write-token"),
                    _write_part(call, _around(t, len(slots)), "stateless-write-neighbourhood")]
    elif op == "copy":
        pairs = call["block_mapping"]
        dsts = [d for _, d in pairs]
        i = dsts.index(index[0]) if index and "cache" in str(getattr(error, "what", "")) and index[0] in dsts else 0
        if pairs:
            out += [dict(call, name="stateless-copy-pair", block_mapping=[pairs[i]]),
                    dict(call, name="stateless-copy-neighbourhood",
                         block_mapping=[pairs[j] for j in _around(i, len(pairs))])]
            if call["layers"] > 1:
                out.insert(0, dict(call, name="stateless-copy-pair-one-layer", block_mapping=[pairs[i]], layers=1))
    else:
        cu = call["cu_lens"]
        N = len(cu) - 1
        row = index[0] if index and "out_" in str(getattr(error, "what", "")) else None
        r = N - 1 if row is None or row >= cu[-1] else int(np.searchsorted(cu, row, side="right")) - 1
        if N:
            out += [_gather_part(call, [r], "stateless-gather-request"),
                    _gather_part(call, _around(r, N), "stateless-gather-neighbourhood")]
    out.append(dict(call, name=f"stateless-{op}-call"))
    return out


def shrink(call: dict[str, Any], error: BaseException | None, kernel: Callable, device: Any) -> dict[str, Any]:
    """The first candidate that still fails (the whole call if none smaller does)."""
    options = candidates(call, error)
    for part in options[:-1]:
        if not run_kv_call(part, kernel, device).passed:
            return part
    return options[-1]


def kv_stateless_crash(header: dict[str, Any], exitcode: int | None) -> str:
    """A call of the KV stateless mode is not journaled whole: say which, and how to
    run it again."""
    from blocktable.properties.child import describe_exit

    return (f"blocktable: the process running the kv-{header['op']} kernel {describe_exit(exitcode)} during "
            f"stateless call {header['batch']}\n  kernel:  {header['kernel']}\n"
            f"  device:  {header.get('device', 'unknown')}\n  config:  {header['call']}\n"
            f"  no case file (the call is not journaled whole); the same seed and kernels repeat it: "
            f"blocktable fuzz --stateless --seed {header['seed']} {header['flags']}")


def kv_stateless_child(job: Job, send: Send) -> None:
    backend = prepare_backend(job, send)
    if backend is None:
        return
    kernels = prepare_kv(job, send)
    if kernels is None:
        return
    kinds = named_kinds(job)
    flags = " ".join(f"--kv-{kind} {spec}" for kind, spec in kinds)  # the draws depend on all of them
    device = backend.device
    rng = np.random.default_rng(job.seed)
    # The interpreter runs a Triton kernel as numpy, one program at a time: calls stay
    # small there. On a GPU a cache holds up to a million elements.
    max_elements, max_tokens = (1 << 15, 300) if backend.interpreted else (1 << 20, 1 << 14)
    journal = Journal(Path(job.journal))
    described = backend.describe()
    start = time.monotonic()
    deadline = start + 60 * job.minutes if job.minutes else None
    rounds = job.examples or 100
    stats = Stats(batches=0, tokens=0)
    send(Progress("stateless", dataclasses.replace(stats)))
    last_sent = 0.0
    done = 0
    while (deadline is None and done < rounds) or (deadline is not None and time.monotonic() < deadline):
        done += 1
        for kind, spec in kinds:
            kernel = getattr(kernels, kind)
            call = dict(draw(kind, rng, max_elements, max_tokens), name=f"stateless-{kind}-call")
            journal.start({"kind": "kv-stateless-batch", "kernel": spec, "op": kind, "device": described,
                           "batch": stats.batches + 1, "seed": job.seed, "call": call_text(call),
                           "flags": flags})
            outcome = run_kv_call(call, kernel, device)
            if not outcome.passed:
                shrunk = shrink(call, outcome.error, kernel, device)
                case = Case("kv-call", spec, {}, call=shrunk,
                            provenance=provenance(described, seed=job.seed, mode="stateless"))
                stats.elapsed = time.monotonic() - start
                journal.close()
                send_failure(send, case, run_kv_call(shrunk, kernel, device), backend, Path(job.out or "."), stats,
                             kernel=kernel, verbose=job.verbose)
                return
            stats.batches += 1
            stats.tokens += call_size(call)
        stats.examples = done  # rounds: each kind named once
        now = time.monotonic()
        if now - last_sent > 0.25:
            last_sent = now
            stats.elapsed = now - start
            send(Progress("stateless", dataclasses.replace(stats)))
    journal.close()
    stats.elapsed = time.monotonic() - start
    send(Result("pass", device=described, stats=stats))
