"""The paired checking object: the reference and the implementation side by side,
every step applied to both and everything compared after it (docs/contract.md §3-§9).

A step is a plain dict (lockstep/schema.py), so a run is a list of steps:
Hypothesis generates them (lockstep/machine.py), case files store them, `blocktable
replay` applies them again. Each step is announced to `on_step` before it runs (the
crash journal), dispatched to its operation (lockstep/ops.py, step.py, prefix.py),
and followed by the comparisons of lockstep/check.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from blocktable.device import Backend
from blocktable.plugin import Plugins, load_v2_kernels
from blocktable.properties import fault
from blocktable.properties.lockstep import check, ops, prefix, schema
from blocktable.properties.lockstep.kv import KVWorld
from blocktable.properties.lockstep.state import State
from blocktable.properties.lockstep.step import step
from blocktable.properties.lockstep.v2 import V2World
from blocktable.properties.world import WorldConfig

OPERATIONS: dict[str, Callable[..., Any]] = {
    "add": ops.add, "step": step, "fork": ops.fork, "finish": ops.finish, "preempt": ops.preempt,
    "resume": ops.resume, "move": ops.move, "swap": ops.swap, "condense": ops.condense, "reject": ops.reject,
    "reset": prefix.reset,
}


class Lockstep(State):
    """One run: build both sides from `world`, then `apply` steps."""

    def __init__(self, world: WorldConfig, kernels: Plugins, backend: Backend,
                 on_step: Callable[[dict[str, Any]], None] | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        super().__init__(world, kernels, backend, on_event)
        self.on_step = on_step
        self.program: list[dict[str, Any]] = []
        self.failed_at: float | None = None  # when a step first failed (time.monotonic)
        if world.kv is not None:  # docs/contract.md §9
            self.kv = KVWorld(self, world.kv, kernels.kv)
        if world.v2 is not None:  # docs/contract.md §10
            v2 = kernels.v2 if kernels.v2 is not None else load_v2_kernels()
            self.v2 = V2World(self, world.v2, v2.kernels())
        check.check(self)

    def apply(self, step: dict[str, Any]) -> Any:
        op = schema.OPS.get(step.get("op"))  # type: ignore[arg-type]
        if op is None:
            raise ValueError(f"unknown step {step!r}")
        if self.on_step is not None:
            self.on_step(step)
        self.program.append(dict(step))
        args = {k: v for k, v in step.items() if k != "op"}
        self.device_rows = None
        try:
            result = OPERATIONS[op.name](self, **args)
            check.check(self)
        except Exception as error:
            fault.check(error)
            if self.failed_at is None:
                self.failed_at = time.monotonic()
            raise
        return result
