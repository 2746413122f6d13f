"""Whether a failure failed again in a fresh process before its case file was
written (run/confirm.py decides; the case file and the report carry it), and what
that says about the kernel (`verdict`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Confirmation:
    reproduced: bool  # the case alone failed again in a fresh process
    whole_run_reproduced: bool | None  # the whole run that found it did; None: not tried
    note: str  # the verdict in words, as case files keep it
    # The process that found it replayed the case after its earlier calls (the same
    # buffers, for a stateless call) and it failed again; None: not known.
    repeated_in_process: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {"reproduced": self.reproduced, "whole_run_reproduced": self.whole_run_reproduced,
                "repeated_in_process": self.repeated_in_process, "note": self.note}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Confirmation:
        return cls(bool(data["reproduced"]), data.get("whole_run_reproduced"), str(data.get("note", "")),
                   data.get("repeated_in_process"))

    @property
    def verdict(self) -> str:
        return verdict(self.reproduced, self.whole_run_reproduced, self.repeated_in_process)


def verdict(reproduced: bool, whole_run_reproduced: bool | None, repeated_in_process: bool | None) -> str:
    """What the replays say, as one word:

    - "confirmed": the case alone fails again in a fresh process;
    - "state": it passes alone in a fresh process but fails after earlier calls, in
      the whole run replayed in a fresh process or in the process that found it
      (replayed there after its earlier calls): the harness runs a case the same way
      every time, so what differs is the kernel's state. The whole run may pass in a
      fresh process while the process that found it fails again: state kept by
      `data_ptr` depends on which buffers land at which addresses, and that differs
      from one process to the next;
    - "nondeterministic": it failed once and then passed, alone in a fresh process and
      after its earlier calls (the whole run, or the process that found it);
    - "unknown": it passes alone in a fresh process, and nothing tells state from chance.
    """
    if reproduced:
        return "confirmed"
    if whole_run_reproduced or repeated_in_process:
        return "state"
    if whole_run_reproduced is False or repeated_in_process is False:
        return "nondeterministic"
    return "unknown"
