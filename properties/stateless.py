"""`blocktable fuzz --stateless`: the slot-mapping kernel alone, in large random
batches generated on the device and checked by the vectorized reading of docs/contract.md §4
(properties/vectorized.py) on the device too.

Each batch is one call with its own K, B, W, R, I: up to thousands of requests
(decode-sized, chunks, long prefills), a random table with ids near 2**31-1 and
zeros, positions contiguous or scattered and running past the row, a tail. A
failing batch is shrunk to the smallest call that still fails (the token, then its
request, then the batch) and saved as a slot-call case file like any other.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blocktable.properties.case import Case, provenance
from blocktable.properties.engine import Send, prepare, send_failure
from blocktable.properties import fault
from blocktable.properties.guard import GuardedCall
from blocktable.properties.journal import Journal
from blocktable.properties.messages import Job, Progress, Result, Stats
from blocktable.properties.replay import run_slot_call, slot_call
from blocktable.properties.strategies import divisors
from blocktable.properties.vectorized import slot_mapping_vectorized
from blocktable.reference.layout import INT32_MAX


def random_call(rng: np.random.Generator, gen: torch.Generator, device: torch.device,
                max_tokens: int) -> tuple[dict[str, int], torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(config, query_start_loc, positions, block_table, Tmax), big arrays made on the device."""
    B = int(rng.choice([1, 2, 4, 8, 16, 32, 64, 128]))
    K = B * int(rng.choice([1, 2, 3, 4]))
    W = int(rng.choice([1, 1, 2, 4, 8]))
    config = dict(kv_block_size=K, kernel_block_size=B, cp_world_size=W, cp_rank=int(rng.integers(W)),
                  cp_interleave=int(rng.choice(divisors(K))))
    shape = rng.choice(["decode", "mixed", "prefill"])
    T_target = int(rng.integers(1, max_tokens + 1))
    if shape == "decode":
        lengths = np.ones(min(T_target, 4096), dtype=np.int64)
    elif shape == "mixed":
        lengths = rng.integers(0, 2 * max(1, T_target // 64) + 1, size=int(rng.integers(1, 257)))
    else:
        lengths = rng.integers(0, max(1, T_target // 4) + 1, size=int(rng.integers(1, 9)))
    N = len(lengths)
    qsl = np.zeros(N + 1, dtype=np.int64)
    qsl[1:] = np.cumsum(lengths)
    T = int(qsl[-1])
    width = int(rng.integers(1, 257))
    rows = N + int(rng.integers(0, 4))
    table = torch.randint(0, 4096, (rows, width), generator=gen, device=device, dtype=torch.int64)
    high = torch.rand((rows, width), generator=gen, device=device) < 0.3
    table = torch.where(high, INT32_MAX - table, table)  # ids near 2**31-1: the int64 rule
    table = torch.where(torch.rand((rows, width), generator=gen, device=device) < 0.05, 0, table).to(torch.int32)
    qsl_t = torch.from_numpy(qsl.astype(np.int32)).to(device)
    if T:
        request = torch.repeat_interleave(torch.arange(N, device=device), torch.from_numpy(lengths).to(device))
        offset = torch.arange(T, device=device) - qsl_t[:-1].long()[request]
        reach = (width // (K // B) + 2) * K * W + 1  # up to two virtual blocks past the row
        start = torch.randint(0, reach, (N,), generator=gen, device=device)
        scattered = torch.rand(N, generator=gen, device=device) < 0.3
        random_pos = torch.randint(0, reach, (T,), generator=gen, device=device)
        positions = torch.where(scattered[request], random_pos, start[request] + offset)
    else:
        positions = torch.zeros(0, dtype=torch.int64, device=device)
    tmax = T + int(rng.choice([0, 1, 7, 64]))
    return config, qsl_t, positions.contiguous(), table, tmax


def run_guarded(kernel: Any, config: dict[str, int], qsl: torch.Tensor, positions: torch.Tensor,
                table: torch.Tensor, tmax: int) -> torch.Tensor:
    call = GuardedCall(table.shape[0], table.shape[1], qsl.numel() - 1, positions.numel(), tmax, positions.device)
    out = call.output()
    kernel(call.qsl.load(qsl), call.positions.load(positions), call.table.load(table), out, **config)
    call.check()
    return out


def shrink(kernel: Any, backend: Any, config: dict[str, int], qsl: torch.Tensor, positions: torch.Tensor,
           table: torch.Tensor, tmax: int, token: int) -> dict[str, Any]:
    """The smallest of: the failing token alone, its request alone, the whole batch,
    that still fails through run_slot_call."""
    qsl_np, pos_np, table_np = qsl.cpu().numpy(), positions.cpu().numpy(), table.cpu().numpy()
    T = len(pos_np)
    candidates = []
    if token >= T:  # the tail: no requests at all
        candidates.append(slot_call("stateless-tail", config, np.zeros(1, np.int32), np.zeros(0, np.int64),
                                    table_np[:1], 2))
    else:
        r = int(np.searchsorted(qsl_np, token, side="right")) - 1
        first, last = int(qsl_np[r]), int(qsl_np[r + 1])
        one = pos_np[token:token + 1].copy()
        whole = pos_np[first:last].copy()
        # Alone in row 0, then at its own request index behind empty requests (some
        # bugs depend on which request or row it is).
        behind = np.zeros(r + 2, np.int32)
        candidates += [
            slot_call("stateless-token", config, np.array([0, 1], np.int32), one, table_np[r:r + 1], 2),
            slot_call("stateless-token-in-place", config, np.append(behind[:-1], 1).astype(np.int32), one,
                      table_np[:r + 1], 2),
            slot_call("stateless-request", config, np.array([0, last - first], np.int32), whole,
                      table_np[r:r + 1], last - first + 1),
            slot_call("stateless-request-in-place", config, np.append(behind[:-1], last - first).astype(np.int32),
                      whole, table_np[:r + 1], last - first + 1),
        ]
    candidates.append(slot_call("stateless-batch", config, qsl_np, pos_np, table_np, tmax))
    for call in candidates:
        if not run_slot_call(call, kernel, backend).passed:
            return call
    return candidates[-1]


def stateless_child(job: Job, send: Send) -> None:
    ready = prepare(job, send)
    if ready is None:
        return
    backend, kernel = ready
    device = backend.device
    rng = np.random.default_rng(job.seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(job.seed)
    max_tokens = 4096 if backend.interpreted else 1 << 20
    # A batch is too big to journal; its number, seed and shape are enough to say
    # where a crash happened and how to repeat it (same seed, same device).
    journal = Journal(Path(job.journal))
    start = time.monotonic()
    deadline = start + 60 * job.minutes if job.minutes else None
    batches = job.examples or 100
    stats = Stats(batches=0, tokens=0)
    send(Progress("stateless", dataclasses.replace(stats)))  # set up: the parent may show progress now
    last_sent = 0.0
    while (deadline is None and stats.batches < batches) or (deadline is not None and time.monotonic() < deadline):
        config, qsl, positions, table, tmax = random_call(rng, gen, device, max_tokens)
        expected = slot_mapping_vectorized(qsl, positions, table, tmax, **config)
        journal.start({"kind": "stateless-batch", "kernel": job.kernel, "device": backend.describe(),
                       "batch": stats.batches + 1, "seed": job.seed, "config": config,
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
        stats.batches += 1
        stats.examples = stats.batches
        stats.tokens += tmax
        now = time.monotonic()
        if now - last_sent > 0.25:
            last_sent = now
            stats.elapsed = now - start
            send(Progress("stateless", dataclasses.replace(stats)))
    if not backend.interpreted:
        torch.cuda.synchronize()
    journal.close()
    stats.elapsed = time.monotonic() - start
    send(Result("pass", device=backend.describe(), stats=stats))
