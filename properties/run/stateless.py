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
from blocktable.properties.compare import Discrepancy, Handed, raised
from blocktable.properties.kv.call import run_kv_call
from blocktable.properties.kv.draw import call_size, draw
from blocktable.properties.kv.draw import shrink as shrink_kv
from blocktable.properties.outcome import Outcome
from blocktable.properties.report.describe import kv_call_text, v2_call_text
from blocktable.properties.run.calls import calls as calls_made
from blocktable.properties.run.calls import counted
from blocktable.properties.run.child import Send
from blocktable.properties.run.failure import send_failure
from blocktable.properties.run.journal import Journal
from blocktable.properties.run.messages import Job, Progress, Result, Stats
from blocktable.properties.run.prepare import config_error, prepare, prepare_backend
from blocktable.properties.slot.call import run_slot_call, slot_call
from blocktable.properties.slot.draw import random_call, shrink
from blocktable.properties.slot.guard import GuardedCall
from blocktable.properties.slot.truth import slot_mapping_vectorized
from blocktable.properties.v2 import draw as v2_draw
from blocktable.properties.v2.call import run_v2_call


def kv_call_sizes(interpreted: bool) -> tuple[int, int]:
    """(elements a cache holds, tokens a call has), at most, in a stateless KV call.
    The interpreter runs a Triton kernel as numpy, one program at a time: calls stay
    small there. On a GPU a cache holds up to a million elements."""
    return (1 << 15, 300) if interpreted else (1 << 20, 1 << 14)


def run_guarded(kernel: Any, config: dict[str, int], call: GuardedCall, qsl: torch.Tensor, positions: torch.Tensor,
                table: torch.Tensor) -> torch.Tensor:
    """The kernel's output of one batch, run in `call`'s guarded buffers."""
    args = (call.qsl.load(qsl), call.positions.load(positions), call.table.load(table), call.output())
    handed = Handed.of(plugin.SLOT_MAPPING, args)
    kernel(*args, **config)
    handed.check("stateless-batch slot mapping")  # before the output is read
    call.check()
    return args[3]


def run_batch(kernel: Any, config: dict[str, int], qsl: torch.Tensor, positions: torch.Tensor, table: torch.Tensor,
              tmax: int, expected: torch.Tensor, call: GuardedCall | None = None) -> tuple[Outcome, int, GuardedCall]:
    """One batch against the truth: the outcome (a failure names the first wrong
    slot), the first wrong token (0 when the kernel raised) and the buffers it ran
    in. `call`: an earlier run's buffers, to run in again (the same memory, every
    guard and the output as they were before that run)."""
    if call is None:
        call = GuardedCall(table.shape[0], table.shape[1], qsl.numel() - 1, positions.numel(), tmax, positions.device)
    else:
        call.reset()
    try:
        actual = run_guarded(kernel, config, call, qsl, positions, table)
    except Discrepancy as error:  # it wrote outside its output, or changed what it was handed
        return Outcome(False, error), 0, call
    except Exception as error:  # the kernel raised
        fault.check(error)
        return Outcome(False, raised("stateless-batch slot mapping", error)), 0, call
    if torch.equal(actual, expected):
        return Outcome(True), 0, call
    differ = torch.nonzero(actual != expected)[:, 0]
    token = int(differ[0])
    want, got = int(expected[token]), int(actual[token])
    return Outcome(False, Discrepancy("stateless-batch slot mapping", f"{len(differ)} of {tmax} slots differ; first "
                                      f"at token {token}: expected {want}, got {got}", index=(token,), expected=want,
                                      actual=got)), token, call


# A stateless batch's size: the tokens a batch is drawn for, at most (slot/draw.py's
# `random_call`; its mixed shape may make up to 8 times as many). A batch's time on a
# GPU is mostly fixed costs: batches of up to 2**20 tokens checked 0.115G tokens/s (an
# H200), of up to 2**24 1.4G (an H100; docs/results.md). Under the interpreter calls
# stay small.
INTERPRETED_CAP = 4096
LARGEST_CAP = 1 << 24
SMALLEST_CAP = 1 << 16
# Bytes of device memory a batch can hold at its peak, per token of the cap: up to 8
# tokens per token of the cap, each with some 25 int64 values alive at once (the draw,
# the truth, the guarded buffers, the copies that show what the kernel was handed);
# 150 bytes per token were measured at the peak on the CPU.
WORST_BYTES_PER_CAP_TOKEN = 8 * 25 * 8


def batch_cap(total_bytes: int, sharers: int) -> int:
    """The default cap on a GPU of `total_bytes` of memory that `sharers` processes of
    the run fuzz on at once: each one's largest batch fits beside the others'. It
    depends on the device and --jobs only, not on what is free at the time, so the
    same seed on the same kind of GPU repeats the same batches."""
    fits = total_bytes // (max(1, sharers) * WORST_BYTES_PER_CAP_TOKEN)
    return max(SMALLEST_CAP, min(LARGEST_CAP, fits))


def stateless_cap(job: Job, backend: Any) -> int:
    """The cap this child draws its batches for: --max-tokens, else the default."""
    if job.max_tokens is not None:
        return job.max_tokens
    if backend.interpreted:
        return INTERPRETED_CAP
    return batch_cap(torch.cuda.get_device_properties(backend.device).total_memory, job.device_sharers)


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
    max_tokens = stateless_cap(job, backend)
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
                       "requests": qsl.numel() - 1, "tokens": positions.numel(), "max_num_tokens": tmax,
                       "max_tokens": max_tokens})
        seen, token, buffers = run_batch(kernel, config, qsl, positions, table, tmax, expected)
        if not seen.passed:
            # The same batch again in the same memory, before anything else runs: a
            # kernel that keeps state by data_ptr fails again here, and passes in a
            # fresh process (run/confirm.py tells the two apart by this).
            again, _, _ = run_batch(kernel, config, qsl, positions, table, tmax, expected, buffers)
            call = shrink(kernel, backend, config, qsl, positions, table, tmax, token)
            replayed = run_slot_call(call, kernel, backend)
            if replayed.passed:  # not even here now: the case is the batch as it failed
                call = slot_call("stateless-batch", config, qsl.cpu().numpy(), positions.cpu().numpy(),
                                 table.cpu().numpy(), tmax)
            case = Case("slot-call", job.kernel, {}, call=call,
                        provenance=provenance(backend.describe(), seed=job.seed, mode="stateless"))
            stats.elapsed = time.monotonic() - start
            journal.close()
            send_failure(send, case, seen if replayed.passed else replayed, backend, Path(job.out or "."), stats,
                         kernel=kernel, verbose=job.verbose, repeated=not (replayed.passed and again.passed))
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
    max_elements, max_tokens = kv_call_sizes(backend.interpreted)
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
                replayed = run_kv_call(shrunk, kernel, device, job.strict_nan)  # again, after the earlier calls
                if replayed.passed:  # not even here now: the case is the call as it failed
                    shrunk, replayed = call, outcome
                case = Case("kv-call", spec, {}, call=shrunk, strict_nan=job.strict_nan,
                            provenance=provenance(described, seed=job.seed, mode="stateless"))
                stats.elapsed = time.monotonic() - start
                journal.close()
                send_failure(send, case, replayed, backend, Path(job.out or "."), stats, kernel=kernel,
                             verbose=job.verbose, repeated=replayed is not outcome)
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
                replayed = run_v2_call(shrunk, kernel, device)  # again, after the earlier calls
                if replayed.passed:  # not even here now: the case is the call as it failed
                    shrunk, replayed = call, outcome
                case = Case("v2-call", spec, {}, call=shrunk,
                            provenance=provenance(described, seed=job.seed, mode="stateless"))
                stats.first_failure_s, stats.examples_to_failure = found - start, done
                stats.elapsed = time.monotonic() - start
                journal.close()
                send_failure(send, case, replayed, backend, Path(job.out or "."), stats, kernel=kernel,
                             verbose=job.verbose, repeated=replayed is not outcome)
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
