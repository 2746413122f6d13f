"""Running harness work in a child process, so that a kernel that crashes its
process (segfault, illegal memory access, os._exit) takes only the child down.

The child sends dict messages over a queue ({"type": "progress" | "result", ...});
the parent hands each to a callback and returns the result, or None if the child
died without one (then `exitcode` says how: negative is the killing signal).
"""

from __future__ import annotations

import importlib
import multiprocessing
import queue
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class ChildOutcome:
    result: dict[str, Any] | None
    exitcode: int | None


def _entry(target: str, payload: dict[str, Any], messages: Any) -> None:
    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    function(payload, messages.put)


def run_in_child(target: str, payload: dict[str, Any],
                 on_message: Callable[[dict[str, Any]], None] | None = None) -> ChildOutcome:
    """target: "package.module:function", called as function(payload, send)."""
    context = multiprocessing.get_context("spawn")  # no forked CUDA state, a fresh TRITON_INTERPRET
    messages = context.Queue()
    process = context.Process(target=_entry, args=(target, payload, messages), daemon=True)
    process.start()
    result = None
    while True:
        try:
            message = messages.get(timeout=0.2)
        except queue.Empty:
            if not process.is_alive():
                break
            continue
        if message.get("type") == "result":
            result = message
        elif on_message is not None:
            on_message(message)
    process.join()
    return ChildOutcome(result, process.exitcode)


def describe_exit(exitcode: int | None) -> str:
    import signal

    from blocktable.properties.fault import DEVICE_FAULT_EXIT

    if exitcode is None:
        return "did not exit"
    if exitcode == DEVICE_FAULT_EXIT:
        return "hit a device fault (an illegal memory access or the like, which poisons the process)"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"
