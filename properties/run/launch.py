"""How a child process starts: forked from a server that has the heavy libraries
loaded, living in the environment its parent has at that moment.

A spawned child spends about two seconds importing torch and numpy before any of
our code runs, and one command starts several children (the run, the confirmation,
a fresh one after every crash while shrinking); a test suite starts hundreds.
multiprocessing's fork server imports those libraries once per parent, and every
child is a fork of it. The parent itself is never forked: it may hold CUDA state,
which a forked child cannot use. The server imports libraries only, none of our
modules and not Triton: a kernel module, and Triton's own, reads TRITON_INTERPRET
when it is imported, and that is each child's own (device.select sets it).

What a spawned child got from its parent for free, a forked one is handed:
- the environment: the server's is the one its parent had when the server
  started. Each child adopts the parent's current one (`Start.environment`)
  before its target's module is imported: the target travels as pickled bytes,
  unpickled after the environment is in place. (The entry points' own modules,
  child.py and crash.py with what they import, are imported before; none reads a
  setting when imported, and none imports a kernel module.);
- SIGINT ignored or not, as the parent decides at the start (child.py's
  `sigint_ignored`), not as it was when the server started.

The workers of `--jobs` are still spawned (workers.py): each must load the
libraries with thread-pool sizes of its own.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
from dataclasses import dataclass
from typing import Any

# Imported by the server, inherited by every child: libraries whose import keeps
# nothing of the server's environment or working folder that a child would need its
# own of. Not Triton: triton.language makes Triton's own @triton.jit helpers
# (tl.cdiv and the like) when imported, interpreted or compiled as TRITON_INTERPRET
# says at that moment, and a child chooses its backend later (device.select). Not
# Hypothesis: it fixes its storage folder (.hypothesis under the working folder)
# when imported. Each costs a child a fraction of torch's import.
PRELOAD = ["numpy", "torch", "rich.console", "rich.progress", "rich.table"]


def context() -> Any:
    """The context children are started from (its Queue, RawValue, Process)."""
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(PRELOAD)  # read when the server starts: once per parent
    return forkserver


@dataclass
class Start:
    """What a child needs before it imports its target: the parent's environment and
    its SIGINT disposition when it started the child, and the objects it is handed
    (its target, its job), pickled."""

    payload: bytes
    environment: dict[str, str]
    ignore_sigint: bool

    @classmethod
    def of(cls, *objects: Any) -> Start:
        """Made in the parent as it starts the child (inside child.sigint_ignored)."""
        return cls(pickle.dumps(objects), dict(os.environ), signal.getsignal(signal.SIGINT) is signal.SIG_IGN)

    def begin(self) -> tuple[Any, ...]:
        """In the child: adopt the environment and SIGINT disposition, then unpickle
        the objects."""
        os.environ.clear()
        os.environ.update(self.environment)
        signal.signal(signal.SIGINT, signal.SIG_IGN if self.ignore_sigint else signal.default_int_handler)
        return pickle.loads(self.payload)
