"""`blocktable fuzz --stateless`: one kernel alone, on large random calls, each
compared whole with the truth; a failing call is shrunk (slot/draw.py, kv/draw.py)
and saved as a "slot-call" or "kv-call" case file like any other.

- The slot-mapping kernel: batches generated on the device (slot/draw.py) and
  checked there by the vectorized reading of docs/contract.md §4 (slot/truth.py).
  Each batch is one call with its own K, B, W, R, I: up to thousands of requests
  (decode-sized, chunks, long prefills), a random table with ids near 2**31-1 and
  zeros, positions contiguous or scattered and running past the row, a tail.
- `--kv-write/--kv-copy/--kv-gather SPEC`: each KV kernel named (docs/contract.md
  §9), one call a kind in turn, behind guards (kv/call.py); `--examples N` is N
  calls of each.
- `--v2-append/--v2-gather/--v2-slots SPEC`: each V2 block-table kernel named
  (docs/contract.md §10) the same way (v2/call.py), a failure saved as a "v2-call"
  case.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blocktable import plugin
from blocktable.properties import fault
from blocktable.properties.cases.case import Case, provenance
from blocktable.properties.compare import Handed
from blocktable.properties.kv.call import run_kv_call
from blocktable.properties.kv.draw import call_size, draw
from blocktable.properties.kv.draw import shrink as shrink_kv
from blocktable.properties.report.describe import kv_call_text, v2_call_text
from blocktable.properties.run.calls import calls as calls_made
from blocktable.properties.run.calls import counted
from blocktable.properties.run.child import Send
from blocktable.properties.run.failure import send_failure
from blocktable.properties.run.journal import Journal
from blocktable.properties.run.messages import Job, Progress, Result, Stats
from blocktable.properties.run.prepare import config_error, prepare, prepare_backend
from blocktable.properties.slot.call import run_slot_call
from blocktable.properties.slot.draw import random_call, shrink
from blocktable.properties.slot.guard import GuardedCall
from blocktable.properties.slot.truth import slot_mapping_vectorized
from blocktable.properties.v2 import draw as v2_draw
from blocktable.properties.v2.call import run_v2_call


def run_guarded(kernel: Any, config: dict[str, int], qsl: torch.Tensor, positions: torch.Tensor,
                table: torch.Tensor, tmax: int) -> torch.Tensor:
    call = GuardedCall(table.shape[0], table.shape[1], qsl.numel() - 1, positions.numel(), tmax, positions.device)
    args = (call.qsl.load(qsl), call.positions.load(positions), call.table.load(table), call.output())
    handed = Handed.of(plugin.SLOT_MAPPING, args)
    kernel(*args, **config)
    handed.check("stateless-batch slot mapping")  # before the output is read
    call.check()
    return args[3]


def stateless_child(job: Job, send: Send) -> None:
    ready = prepare(job, send)
    if ready is None:
        return
    backend, kernels = ready
    kernel = kernels.slot
    device = backend.device
    rng = np.random.default_rng(job.seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(job.seed)
    max_tokens = 4096 if backend.interpreted else 1 << 20
    # A batch is too big to journal; its number, seed and shape are enough to say
    # where a crash happened and how to repeat it (same seed, same device).
    journal = Journal(job.journal_path())
    start = time.monotonic()
    deadline = job.deadline or (start + 60 * job.minutes if job.minutes else None)
    batches = job.examples or 100
    done = tokens = 0
    stats = Stats(batches=0, tokens=0)
    send(Progress("stateless", dataclasses.replace(stats)))  # set up: the parent may show progress now
    last_sent = 0.0
    while (deadline is None and done < batches) or (deadline is not None and time.monotonic() < deadline):
        config, qsl, positions, table, tmax = random_call(rng, gen, device, max_tokens)
        expected = slot_mapping_vectorized(qsl, positions, table, tmax, **config)
        journal.start({"kind": "stateless-batch", "kernel": job.kernel, "device": backend.describe(),
                       "batch": done + 1, "seed": job.seed, "config": config,
                       "requests": qsl.numel() - 1, "tokens": positions.numel(), "max_num_tokens": tmax})
        try:
            actual = run_guarded(kernel, config, qsl, positions, table, tmax)
            failed = not torch.equal(actual, expected)
        except Exception as error:  # the kernel raised, or wrote outside its output
            fault.check(error)
            failed, actual = True, None
        if failed:
            token = int(torch.nonzero(actual != expected)[0, 0]) if actual is not None else 0
            call = shrink(kernel, backend, config, qsl, positions, table, tmax, token)
            case = Case("slot-call", job.kernel, {}, call=call,
                        provenance=provenance(backend.describe(), seed=job.seed, mode="stateless"))
            stats.elapsed = time.monotonic() - start
            journal.close()
            send_failure(send, case, run_slot_call(call, kernel, backend), backend, Path(job.out or "."), stats,
                         kernel=kernel, verbose=job.verbose)
            return
        done += 1
        tokens += tmax
        stats.batches = stats.examples = done
        stats.tokens = tokens
        now = time.monotonic()
        if now - last_sent > 0.25:
            last_sent = now
            stats.elapsed = now - start
            stats.calls = calls_made()
            send(Progress("stateless", dataclasses.replace(stats)))
    if not backend.interpreted:
        torch.cuda.synchronize()
    journal.close()
    stats.elapsed, stats.calls = time.monotonic() - start, calls_made()
    send(Result("pass", device=backend.describe(), stats=stats))


def kv_stateless_child(job: Job, send: Send) -> None:
    backend = prepare_backend(job, send)
    if backend is None:
        return
    kinds = [(kind, job.kv[kind]) for kind in plugin.KV_KINDS if kind in job.kv]
    try:
        kernels = {kind: counted(f"kv-{kind}", plugin.load_kv(kind, spec)) for kind, spec in kinds}
    except plugin.PluginError as e:
        config_error(send, e)
        return
    flags = " ".join(f"--kv-{kind} {spec}" for kind, spec in kinds)  # the draws depend on all of them
    device = backend.device
    rng = np.random.default_rng(job.seed)
    # The interpreter runs a Triton kernel as numpy, one program at a time: calls stay
    # small there. On a GPU a cache holds up to a million elements.
    max_elements, max_tokens = (1 << 15, 300) if backend.interpreted else (1 << 20, 1 << 14)
    journal = Journal(job.journal_path())
    described = backend.describe()
    start = time.monotonic()
    deadline = job.deadline or (start + 60 * job.minutes if job.minutes else None)
    rounds = job.examples or 100
    stats = Stats(batches=0, tokens=0)
    send(Progress("stateless", dataclasses.replace(stats)))
    last_sent = 0.0
    done = calls = tokens = 0
    while (deadline is None and done < rounds) or (deadline is not None and time.monotonic() < deadline):
        done += 1
        for kind, spec in kinds:
            kernel = kernels[kind]
            call = dict(draw(kind, rng, max_elements, max_tokens), name=f"stateless-{kind}-call")
            journal.start({"kind": "kv-stateless-batch", "kernel": spec, "op": kind, "device": described,
                           "batch": calls + 1, "seed": job.seed, "call": kv_call_text(call),
                           "flags": flags})
            outcome = run_kv_call(call, kernel, device, job.strict_nan)
            if not outcome.passed:
                shrunk = shrink_kv(call, outcome.error, kernel, device, job.strict_nan)
                case = Case("kv-call", spec, {}, call=shrunk, strict_nan=job.strict_nan,
                            provenance=provenance(described, seed=job.seed, mode="stateless"))
                stats.elapsed = time.monotonic() - start
                journal.close()
                send_failure(send, case, run_kv_call(shrunk, kernel, device, job.strict_nan), backend,
                             Path(job.out or "."), stats,
                             kernel=kernel, verbose=job.verbose)
                return
            calls += 1
            tokens += call_size(call)
            stats.batches, stats.tokens = calls, tokens
        stats.examples = done  # rounds: each kind named once
        now = time.monotonic()
        if now - last_sent > 0.25:
            last_sent = now
            stats.elapsed = now - start
            stats.calls = calls_made()
            send(Progress("stateless", dataclasses.replace(stats)))
    journal.close()
    stats.elapsed, stats.calls = time.monotonic() - start, calls_made()
    send(Result("pass", device=described, stats=stats))


def v2_stateless_child(job: Job, send: Send) -> None:
    """Each V2 block-table kernel named, one call a kind in turn (v2/call.py)."""
    backend = prepare_backend(job, send)
    if backend is None:
        return
    kinds = [(kind, job.v2[kind]) for kind in plugin.V2_KINDS if kind in job.v2]
    try:
        kernels = {kind: counted(f"v2-{kind}", plugin.load_v2(kind, spec)) for kind, spec in kinds}
    except plugin.PluginError as e:
        config_error(send, e)
        return
    flags = " ".join(f"--v2-{kind} {spec}" for kind, spec in kinds)  # the draws depend on all of them
    device = backend.device
    rng = np.random.default_rng(job.seed)
    limits = v2_draw.INTERPRETED if backend.interpreted else v2_draw.COMPILED
    journal = Journal(job.journal_path())
    described = backend.describe()
    start = time.monotonic()
    deadline = job.deadline or (start + 60 * job.minutes if job.minutes else None)
    rounds = job.examples or 100
    stats = Stats(batches=0, tokens=0)
    send(Progress("stateless", dataclasses.replace(stats)))
    last_sent = 0.0
    done = calls = size = 0
    while (deadline is None and done < rounds) or (deadline is not None and time.monotonic() < deadline):
        done += 1
        for kind, spec in kinds:
            kernel = kernels[kind]
            call = v2_draw.draw(kind, rng, limits)
            journal.start({"kind": "v2-stateless-batch", "kernel": spec, "op": kind, "device": described,
                           "batch": calls + 1, "seed": job.seed, "call": v2_call_text(call), "flags": flags})
            outcome = run_v2_call(call, kernel, device)
            if not outcome.passed:
                found = time.monotonic()
                shrunk = v2_draw.shrink(call, outcome.error, kernel, device)
                case = Case("v2-call", spec, {}, call=shrunk,
                            provenance=provenance(described, seed=job.seed, mode="stateless"))
                stats.first_failure_s, stats.examples_to_failure = found - start, done
                stats.elapsed = time.monotonic() - start
                journal.close()
                send_failure(send, case, run_v2_call(shrunk, kernel, device), backend, Path(job.out or "."), stats,
                             kernel=kernel, verbose=job.verbose)
                return
            calls += 1
            size += v2_draw.call_size(call)
            stats.batches, stats.tokens = calls, size
        stats.examples = done  # rounds: each kind named once
        now = time.monotonic()
        if now - last_sent > 0.25:
            last_sent = now
            stats.elapsed, stats.calls = now - start, calls_made()
            send(Progress("stateless", dataclasses.replace(stats)))
    journal.close()
    stats.elapsed, stats.calls = time.monotonic() - start, calls_made()
    send(Result("pass", device=described, stats=stats))
