"""Whether a failure failed again in a fresh process before its case file was
written (run/confirm.py decides; the case file and the report carry it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Confirmation:
    reproduced: bool  # the case alone failed again in a fresh process
    whole_run_reproduced: bool | None  # the whole run that found it did; None: not tried
    note: str  # the verdict in words, as case files keep it

    def to_json(self) -> dict[str, Any]:
        return {"reproduced": self.reproduced, "whole_run_reproduced": self.whole_run_reproduced, "note": self.note}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Confirmation:
        return cls(bool(data["reproduced"]), data.get("whole_run_reproduced"), str(data.get("note", "")))
