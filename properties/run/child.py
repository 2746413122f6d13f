"""Running harness work in a child process, so that a kernel that crashes its
process (segfault, illegal memory access, os._exit) takes only the child down.

The child gets a Job and sends messages (run/messages.py) over a queue; the parent
hands each to a callback and returns the Result, or None if the child died without
one (then `exitcode` says how: negative is the killing signal). A child's entry
point is a function `target(job, send)`, passed as itself: the child imports it
by its module and name.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from blocktable.properties.run import launch
from blocktable.properties.run.launch import Start
from blocktable.properties.run.messages import Job, Message, Result

Send = Callable[[Message], None]
Target = Callable[[Job, Send], None]


@dataclass
class ChildOutcome:
    result: Result | None
    exitcode: int | None
    timed_out: bool = False  # stopped at `until` (run_in_child) before it sent its result


HUNG_EXIT = -1000  # not a real exit status: the watchdog stopped a kernel call that did not return


def _entry(start: Start, messages: Any, heartbeat: Any) -> None:
    target, job = start.begin()
    from blocktable.properties.run.calls import watch

    watch(heartbeat)
    target(job, messages.put)


def hung(heartbeat: Any, call_timeout: float | None) -> bool:
    """Whether the kernel call under way (if any) has run past `call_timeout`."""
    import time

    started = heartbeat.value
    return bool(call_timeout) and started > 0 and time.monotonic() - started > call_timeout


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Start children inside this: they ignore SIGINT for their whole life (a
    spawned one because an ignored signal stays ignored across exec, and Python then
    installs no handler of its own; a forked one because launch.Start sets it so
    first), so that Ctrl-C, which reaches the whole process group, interrupts the
    parent alone; the parent stops them and says once what it kept. Only the main
    thread may set handlers: from another thread (the mutation gate's pool) children
    start as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def stop(process: Any) -> None:
    """Kill a child that is still running (the parent was interrupted) and reap it."""
    if process.is_alive():
        process.kill()
    process.join()


def run_in_child(target: Target, job: Job, on_message: Callable[[Message], None] | None = None,
                 until: float | None = None) -> ChildOutcome:
    """Run target(job, send) in a child process (launch.py); one still running at
    `until` (time.monotonic()) is stopped."""
    import time

    context = launch.context()
    messages = context.Queue()
    heartbeat = context.RawValue("d", 0.0)  # no lock: no semaphore to leak when the child is killed
    with sigint_ignored():  # inside: the child takes the disposition it sets
        process = context.Process(target=_entry, args=(Start.of(target, job), messages, heartbeat), daemon=True)
        process.start()
    result = None
    timed_out = stuck = False
    try:
        while True:
            try:
                message = messages.get(timeout=0.2)
            except queue.Empty:
                if not process.is_alive():
                    break
                if until is not None and time.monotonic() >= until:
                    timed_out = True
                    break
                if hung(heartbeat, job.call_timeout):
                    stuck = True
                    break
                continue
            if isinstance(message, Result):
                result = message
            elif on_message is not None:
                on_message(message)
    finally:
        stop(process)
        messages.close()
    if stuck and result is None:
        return ChildOutcome(None, HUNG_EXIT)
    return ChildOutcome(result, process.exitcode, timed_out and result is None)


def describe_exit(exitcode: int | None, call_timeout: float | None = None) -> str:
    import signal

    from blocktable.properties.fault import DEVICE_FAULT_EXIT

    if exitcode is None:
        return "did not exit"
    if exitcode == HUNG_EXIT:
        within = f"{call_timeout:g} s" if call_timeout else "the call timeout"
        return f"had a kernel call that did not return within {within} (--call-timeout), and was stopped"
    if exitcode == DEVICE_FAULT_EXIT:
        return "hit a device fault (an illegal memory access or the like, which poisons the process)"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"
