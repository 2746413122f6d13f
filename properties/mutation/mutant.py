"""One mutant of the gate: a small source change imitating a real bug (catalogue.py
says how they are written and chosen)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mutant:
    id: str
    layer: str  # kernel | table | pool | sequence | prefix | kv kernels | oracle kernels | v2 | classes
    path: str
    old: str
    new: str
    imitates: str
    kernel: str = "triton"
    env: dict[str, str] = field(default_factory=dict)
    equivalent: str | None = None
    # Which fuzzing runs for it: the lockstep, or `fuzz --stateless` on these V2 kinds
    # (ours, named as `env` picks them), for the paths one call exercises better than a
    # program does (overlapping staged writes, say).
    stateless_v2: tuple[str, ...] = ()
    # Class plug-ins the lockstep runs it through, by kind (docs/contract.md §11): ours
    # through the class path, "ours" for the pool.
    classes: dict[str, str] = field(default_factory=dict)
