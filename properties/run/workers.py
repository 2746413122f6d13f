"""Several fuzzing processes at once: `blocktable fuzz --jobs N`.

A fuzzing process is bound by one CPU core (Hypothesis, the reference and the
harness are Python), so a host fuzzes N times as fast with N processes, provided
they do not fight over the cores. Left alone they do: torch, numpy's BLAS and
OpenMP each start a thread per core in every process, so N processes run N times
as many busy threads as there are cores. Each worker is therefore started with one
thread per library (the variables below, read when the libraries load, which in a
spawned process is before any of our code runs) and, while there are no more
workers than usable cores, pinned to a core of its own; on a host with several
GPUs the workers take them in turn (CUDA_VISIBLE_DEVICES), as the test suite's
xdist workers do.

Workers are spawned processes like run/child.py's, each with its own
pipe: a worker that dies mid-message loses only its own stream. The first worker
that finds a discrepancy (or dies, or cannot start) ends the others: they are
terminated, and their outcomes say so.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from blocktable.properties.run.child import HUNG_EXIT, Target, hung, sigint_ignored
from blocktable.properties.run.messages import Job, Message, Progress, Result

# Thread pools of the libraries a worker loads: one thread each.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS")
STOP_TIMEOUT_S = 10.0  # how long a terminated worker gets to exit before it is killed


def usable_cores() -> list[int]:
    """The cores this process may run on (a container or `taskset` may allow fewer
    than the machine has)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def auto_jobs(gpu_host: bool) -> int:
    """`--jobs auto`: a worker per usable core; on a GPU host one core is left to
    the parent, which drives the display and the GPU's other clients."""
    return max(1, len(usable_cores()) - (1 if gpu_host else 0))


def parse_jobs(text: str, gpu_host: Callable[[], bool]) -> int:
    """`--jobs N|auto` as a number of workers; ValueError names the value."""
    if text == "auto":
        return auto_jobs(gpu_host())
    try:
        jobs = int(text)
    except ValueError:
        raise ValueError(f"--jobs must be a whole number >= 1 or auto, got {text!r}") from None
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    return jobs


@dataclass
class Placement:
    """Where one worker runs: its environment on top of the parent's, and its core."""

    env: dict[str, str] = field(default_factory=dict)
    core: int | None = None
    gpu: str | None = None

    def describe(self) -> str:
        parts = ([f"core {self.core}"] if self.core is not None else []) + ([f"GPU {self.gpu}"] if self.gpu else [])
        return ", ".join(parts) or "-"


def visible_gpus(device: str) -> list[str]:
    """The GPUs workers spread over: none on the interpreter or with one GPU."""
    if device == "cpu":
        return []
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return []
    listed = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return listed[:torch.cuda.device_count()] if listed else [str(i) for i in range(torch.cuda.device_count())]


def placements(jobs: int, gpus: list[str], cores: list[int] | None = None) -> list[Placement]:
    """One placement per worker. While there are no more workers than cores, each
    gets its own, the highest ones: the parent and the system keep the first
    (which takes most interrupts). With more workers than cores, none is pinned."""
    cores = usable_cores() if cores is None else cores
    pinned = cores[len(cores) - jobs:] if jobs <= len(cores) else None
    result = []
    for i in range(jobs):
        env = dict.fromkeys(THREAD_VARIABLES, "1")
        gpu = gpus[i % len(gpus)] if gpus else None
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        result.append(Placement(env, pinned[i] if pinned else None, gpu))
    return result


@contextmanager
def inherited(placement: Placement) -> Iterator[None]:
    """Set what a process started now inherits: the environment and the CPU
    affinity of the thread that starts it. Restored afterwards."""
    saved = {name: os.environ.get(name) for name in placement.env}
    os.environ.update(placement.env)
    affinity = None
    if placement.core is not None and hasattr(os, "sched_setaffinity"):
        affinity = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {placement.core})
    try:
        yield
    finally:
        if affinity is not None:
            os.sched_setaffinity(0, affinity)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def one_thread() -> None:
    """torch's own pools, in the worker: the variables above cover its intra-op pool
    when read at import; the inter-op pool can only be set before it is first used."""
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already started: it stays as it is
        pass


def _worker(target: Target, job: Job, connection: Connection, heartbeat: Any) -> None:
    from blocktable.properties.run.calls import watch

    one_thread()
    watch(heartbeat)
    target(job, connection.send)


@dataclass
class WorkerOutcome:
    """How one worker ended: its Result (None if it sent none), its exit code, and
    whether it was stopped because another worker ended the run."""

    index: int
    result: Result | None = None
    exitcode: int | None = None
    stopped: bool = False


def ends_the_run(message: Message) -> bool:
    """A result other than a pass, or progress that shows a failure was found (the
    worker is shrinking it now: the others' cores are better left to it)."""
    if isinstance(message, Result):
        return message.status != "pass"
    return isinstance(message, Progress) and message.stats.first_failure_s is not None


def run_workers(target: Target, jobs: list[Job], places: list[Placement],
                on_message: Callable[[int, Message], None] | None = None) -> tuple[list[WorkerOutcome], int | None]:
    """Run target(job, send) for every job, each in its own spawned process placed
    as `places` says; on_message(index, message) for every message but results.
    Returns every worker's outcome and the index of the worker that ended the run
    (a failure, a configuration error, or a death), None if all passed."""
    context = multiprocessing.get_context("spawn")  # no forked CUDA state, a fresh TRITON_INTERPRET
    processes: list[Any] = []
    heartbeats: list[Any] = []  # each worker's kernel call under way (run/calls.py)
    readers: dict[Connection, int] = {}
    outcomes = [WorkerOutcome(i) for i in range(len(jobs))]
    first: int | None = None
    try:
        for i, (job, place) in enumerate(zip(jobs, places)):
            reader, writer = context.Pipe(duplex=False)
            heartbeats.append(context.RawValue("d", 0.0))
            process = context.Process(target=_worker, args=(target, job, writer, heartbeats[-1]), daemon=True)
            with inherited(place), sigint_ignored():
                process.start()
            writer.close()  # the worker holds the only write end: its exit ends the stream
            processes.append(process)
            readers[reader] = i
        while readers and first is None:
            stuck = next((i for i in readers.values() if hung(heartbeats[i], jobs[i].call_timeout)), None)
            if stuck is not None:  # a kernel call that does not return: that worker's finding
                processes[stuck].kill()
                processes[stuck].join()
                outcomes[stuck].exitcode = HUNG_EXIT
                first = stuck
                break
            for ready in wait(list(readers), timeout=1.0):
                reader = cast(Connection, ready)  # wait() hands back the connections it was given
                i = readers[reader]
                try:
                    message = reader.recv()
                except (EOFError, OSError):  # the worker exited; its exit code says how
                    del readers[reader]
                    processes[i].join()
                    outcomes[i].exitcode = processes[i].exitcode
                    if outcomes[i].result is None:
                        first = i
                        break
                    continue
                if isinstance(message, Result):
                    outcomes[i].result = message
                elif on_message is not None:
                    on_message(i, message)
                if ends_the_run(message):
                    first = i
                    break
        if first is not None:
            _finish(first, processes, outcomes, readers, on_message)
    finally:
        for process in processes:  # interrupted: no worker outlives the run
            if process.is_alive():
                process.kill()
                process.join()
    for i, process in enumerate(processes):
        if outcomes[i].exitcode is None:
            outcomes[i].exitcode = process.exitcode
    return outcomes, first


def _finish(first: int, processes: list[Any], outcomes: list[WorkerOutcome], readers: dict[Connection, int],
            on_message: Callable[[int, Message], None] | None) -> None:
    """The worker that ended the run finishes (its result may still be on its way:
    shrinking takes a while); every other is stopped."""
    for i, process in enumerate(processes):
        if i != first and process.is_alive():
            process.terminate()
            outcomes[i].stopped = True
    for i, process in enumerate(processes):
        if i != first:
            process.join(STOP_TIMEOUT_S)
            if process.is_alive():
                process.kill()
                process.join()
    mine = next((r for r, i in readers.items() if i == first), None)
    while mine is not None and outcomes[first].result is None:
        try:
            message = mine.recv()
        except (EOFError, OSError):
            break
        if isinstance(message, Result):
            outcomes[first].result = message
        elif on_message is not None:
            on_message(first, message)
    processes[first].join()
    if outcomes[first].exitcode != HUNG_EXIT:
        outcomes[first].exitcode = processes[first].exitcode
