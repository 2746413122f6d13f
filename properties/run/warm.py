"""Warming Triton's cache with a family of warm calls, in other processes: in the
foreground, reported call by call (`blocktable warm`), or in the background of a
fuzzing run on a GPU, at low priority, as many processes as the cores its fuzzing
processes leave (not pinned), and stopped when the run ends.

Each process is spawned (no forked CUDA state), runs its libraries on one thread and
makes every P-th call. A call that raises is reported in the foreground; in the
background nothing is said (its output goes nowhere): a lockstep run meets the same
variant and reports it in its own terms, and a stateless run checks its own draws.
Triton puts a compiled kernel into its cache by renaming a finished file, so a
process stopped mid-compile leaves nothing half-written, and two processes compiling
one variant leave one copy.

Two families of calls: "lockstep" (lockstep/warm/: what a lockstep run launches) and
"stateless-kv" (kv/warm.py: what the stateless KV modes' draws launch).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from blocktable.properties.run.child import sigint_ignored
from blocktable.properties.run.workers import STOP_TIMEOUT_S, THREAD_VARIABLES, Placement, inherited, one_thread

MAX_BACKGROUND = 8  # background processes: on a GPU host, every variant within seconds
LOW_PRIORITY = 10  # the background's niceness: a fuzzing process sharing its core comes first
FAMILIES = ("lockstep", "stateless-kv")


def family_calls(family: str) -> list[Any]:
    """The warm calls of a family: each has describe() and launches(kernels, backend),
    as lockstep.warm.WarmCall says."""
    if family == "lockstep":
        from blocktable.properties.lockstep.warm import warm_calls

        return list(warm_calls())
    if family == "stateless-kv":
        from blocktable.properties.kv.warm import calls

        return list(calls())
    raise ValueError(f"no warm family {family!r}: one of {', '.join(FAMILIES)}")


@dataclass
class WarmReport:
    """How a foreground warm went: calls made, those that raised (what, error), the
    processes that died before their share was done (exit codes), and its time."""

    total: int
    done: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    died: list[int | None] = field(default_factory=list)
    seconds: float = 0.0


def _share(index: int, processes: int, device_name: str, messages: Any | None, record: str | None,
           family: str) -> None:
    """Process `index` of `processes`: every processes-th call from the index-th on;
    with none raising, it leaves its file under `record` (warmed.py)."""
    from blocktable import device, plugin
    from blocktable.properties.run import warmed

    if messages is None:  # the background: behind the run, and silent
        os.nice(LOW_PRIORITY)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
    one_thread()
    backend = device.select(device_name)
    kernels = plugin.load_kv_kernels(dict.fromkeys(plugin.KV_KINDS, "triton"))
    whole = True
    for call in family_calls(family)[index::processes]:
        error = None
        try:
            for _ in call.launches(kernels, backend):
                pass
        except Exception as e:  # reported by the parent; the other calls still run
            error = f"{type(e).__name__}: {e}"
            whole = False
        if messages is not None:
            messages.put((call.describe(), error))
    if whole and backend.name == "cuda":  # under the interpreter nothing was compiled
        warmed.mark(index, processes, record)


def _start(device_name: str, processes: int, messages: Any | None, record: str | None,
           family: str) -> list[Any]:
    context = multiprocessing.get_context("spawn")
    started = []
    with inherited(Placement(dict.fromkeys(THREAD_VARIABLES, "1"))), sigint_ignored():
        for i in range(processes):
            process = context.Process(target=_share, args=(i, processes, device_name, messages, record, family),
                                      daemon=True)
            process.start()
            started.append(process)
    return started


def _stop(processes: list[Any]) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()


def warm(device_name: str, processes: int, on_call: Callable[[str, str | None], None],
         family: str = "lockstep") -> WarmReport:
    """Every warm call, shared among `processes` processes; on_call(what, error or
    None) as each ends. Ctrl-C stops them all (KeyboardInterrupt goes on up)."""
    from blocktable.properties.run import warmed

    report = WarmReport(total=len(family_calls(family)))
    start = time.monotonic()
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    started = _start(device_name, processes, messages, warmed.key(family), family)
    try:
        while report.done + len(report.failed) < report.total:
            try:
                what, error = messages.get(timeout=0.5)
            except queue.Empty:
                if any(process.is_alive() for process in started):
                    continue
                try:  # all have exited: what they sent last may still be on its way
                    what, error = messages.get(timeout=1.0)
                except queue.Empty:
                    break
            if error is None:
                report.done += 1
            else:
                report.failed.append((what, error))
            on_call(what, error)
        for process in started:  # done: each exits by itself
            process.join(STOP_TIMEOUT_S)
    finally:
        _stop(started)
    report.died = [process.exitcode for process in started if process.exitcode not in (0, None)]
    report.seconds = time.monotonic() - start
    return report


@contextmanager
def in_background(device_name: str, processes: int, record: str | None,
                  family: str = "lockstep") -> Iterator[list[Any]]:
    """The warm calls in `processes` background processes (given to the body) while
    the body runs, each leaving its file under `record` (warmed.key()) when whole."""
    started = _start(device_name, processes, None, record, family)
    try:
        yield started
    finally:
        _stop(started)
