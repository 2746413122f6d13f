"""Device faults that poison their process.

After an illegal memory access (or a misaligned address, a device-side assert, an
unspecified launch failure) every later CUDA call in the process fails too, so
nothing after it can be trusted: Hypothesis would "shrink" to whichever program
touches the device first, and a confirming replay in the same process would fail
for the same stale reason. In the harness's child processes such an error ends the
process at once; the parent then treats it like a segfault (the journal becomes a
case file, and the crash shrinker replays candidates in fresh processes). Tests
that drive the lockstep in their own process leave this off.
"""

from __future__ import annotations

import os
import sys

DEVICE_FAULT_EXIT = 86  # the exit status a child uses for a device fault
_STICKY = ("illegal memory access", "misaligned address", "illegal instruction", "unspecified launch failure",
           "device-side assert")
_enabled = False


def exit_on_device_faults() -> None:
    """Called once by a harness child process."""
    global _enabled
    _enabled = True


def is_device_fault(error: BaseException | None) -> bool:
    """`error`, or an error it was raised from (the harness wraps what a kernel
    raises in a Discrepancy), is one of the device's sticky errors."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, RuntimeError) and any(phrase in str(error).lower() for phrase in _STICKY):
            return True
        error = error.__cause__ or error.__context__
    return False


def check(error: BaseException) -> None:
    """End the process if `error` is a device fault and this is a harness child."""
    if _enabled and is_device_fault(error):
        sys.stderr.write(f"blocktable: device fault, ending the process: {error}\n")
        sys.stderr.flush()
        os._exit(DEVICE_FAULT_EXIT)
