"""How one run of harness work ended: a single kernel call, a lockstep program, or a
case's whole run. Every room that runs something returns one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Outcome:
    passed: bool
    error: BaseException | None = None  # a Discrepancy, or what the implementation raised
    failed_step: int | None = None  # index into the program; None: during set-up or a single call
