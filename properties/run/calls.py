"""How many times each kernel under test was called, counted in the process that
calls it, so that a run that never called a plug-in it was given cannot pass. A
lockstep world calls the KV copy kernel only on a copy-on-write, the gather only
when a step gathers: a short run may reach neither, and a pass then says nothing
about them.

Kinds are named by the flag that names them ("kernel", "kv-write", ..., "v2-slots");
the counts travel in Stats.calls and the summary shows them."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from blocktable.plugin import KV_KINDS, V2_KINDS, Plugins
from blocktable.plugin.classes import CLASS_CONTRACTS, CLASS_KINDS, attribute

_CALLS: Counter[str] = Counter()
# A double shared with the parent (run/child.py): when the kernel call under way
# started (time.monotonic()), 0 between calls. The parent's watchdog reads it.
_heartbeat: Any = None
# --call-timeout's default: longer than any call of ours takes, compiling included.
DEFAULT_CALL_TIMEOUT_S = 300.0


def watch(heartbeat: Any) -> None:
    """Stamp every counted call's start into `heartbeat` (a shared double)."""
    global _heartbeat
    _heartbeat = heartbeat


def counted(kind: str, kernel: Callable) -> Callable:
    """`kernel`, counting its calls under `kind` (inspect.unwrap gives it back)."""
    @functools.wraps(kernel)
    def call(*args: Any, **kwargs: Any) -> Any:
        _CALLS[kind] += 1
        beat = _heartbeat
        if beat is None:
            return kernel(*args, **kwargs)
        beat.value = time.monotonic()
        try:
            return kernel(*args, **kwargs)
        finally:
            beat.value = 0.0

    return call


def counting(plugins: Plugins) -> Plugins:
    """The same kernels, each counting its calls under its kind."""
    kv_kernels: dict[str, Any] = {kind: counted(f"kv-{kind}", getattr(plugins.kv, kind)) for kind in KV_KINDS}
    kv = dataclasses.replace(plugins.kv, **kv_kernels)
    v2 = plugins.v2
    if v2 is not None:
        v2_kernels: dict[str, Any] = {kind: counted(f"v2-{kind}", getattr(v2, kind)) for kind in V2_KINDS}
        v2 = dataclasses.replace(v2, **v2_kernels)
    classes: dict[str, Any] = {}
    for kind, contract in CLASS_CONTRACTS.items():
        cls = getattr(plugins, attribute(kind))
        if cls is not None:  # every method of the protocol counted (and watched) as its kind
            methods = {name: counted(kind, getattr(cls, name)) for name in ("__init__", *contract.methods)}
            body = {**methods, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
            classes[attribute(kind)] = type(cls.__name__, (cls,), body)
    return dataclasses.replace(plugins, slot=counted("kernel", plugins.slot), kv=kv, v2=v2, **classes)


def calls() -> dict[str, int]:
    """The calls so far in this process, by kind."""
    return dict(_CALLS)


def uncalled(named: dict[str, str], counts: dict[str, int]) -> list[str]:
    """The kinds in `named` (kind -> the spec given) that were never called."""
    return [kind for kind in named if not counts.get(kind)]


def never_called(named: dict[str, str], counts: dict[str, int], programs: int, unit: str = "programs") -> str | None:
    """Why a run that passed does not pass: the plug-ins it was given and never
    called, or None when each was called at least once."""
    missing = uncalled(named, counts)
    if not missing:
        return None
    which = ", ".join(f"--{kind} {named[kind]}" for kind in missing)
    verb = "was" if len(missing) == 1 else "were"
    return (f"{which} {verb} never called in {programs} {unit} (nothing drawn used "
            f"{'it' if len(missing) == 1 else 'them'}), so this run checked nothing of "
            f"{'it' if len(missing) == 1 else 'them'}: run more (--examples, --minutes) or another --seed")


def calls_text(counts: dict[str, int], named: Iterable[str] = ()) -> str:
    """`kernel 1,204; kv-write 310; kv-copy 0`, in the flags' order: every kind
    called, and every kind in `named` (0 if it was not)."""
    shown = set(counts) | set(named)
    order = ["kernel", *(f"kv-{k}" for k in KV_KINDS), *(f"v2-{k}" for k in V2_KINDS), *CLASS_KINDS]
    return "; ".join(f"{kind} {counts.get(kind, 0):,}" for kind in order if kind in shown) or "-"
