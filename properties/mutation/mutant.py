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
    # The fp8 encoder the mutated code belongs to, "integer" or "hardware": a backend's
    # write uses only one (blocktable.kv.hardware_fp8), so the other's mutants are not
    # reached there. None: every backend reaches the code.
    fp8_encoder: str | None = None

    def unreached(self, hardware_fp8: bool) -> str | None:
        """Why the fuzzing cannot reach this mutant on a backend (None: it can)."""
        if self.fp8_encoder == "hardware" and not hardware_fp8:
            return ("the path of the GPU's fp8 conversion, which the interpreter and GPUs before compute "
                    "capability 8.9 do not take")
        if self.fp8_encoder == "integer" and hardware_fp8:
            return "the integer fp8 encoder, which this GPU's write does not use (it converts in hardware)"
        return None
