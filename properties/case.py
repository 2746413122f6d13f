"""Case files: a failure as a versioned JSON document that replays in one command.

A case holds the configuration and the program (never a Hypothesis blob, which
breaks across Hypothesis versions), the failure as it was seen, and provenance.
Two kinds:

- "lockstep": a WorldConfig and a list of steps for properties.lockstep.Lockstep;
- "slot-call": one stateless slot-mapping call (config, query_start_loc,
  positions, block table, Tmax) with the reference's expected output.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocktable.properties.world import WorldConfig

FORMAT = "blocktable-case"
VERSION = 1


def provenance(device: str, **extra: Any) -> dict[str, Any]:
    import hypothesis
    import numpy
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency on Linux
        triton_version = None
    import blocktable

    return {"python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__,
            "triton": triton_version, "hypothesis": hypothesis.__version__, "blocktable": blocktable.__version__,
            "device": device, "platform": platform.platform(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv), **extra}


@dataclass
class Case:
    kind: str  # "lockstep" | "slot-call"
    kernel: str
    failure: dict[str, Any]
    world: WorldConfig | None = None
    program: list[dict[str, Any]] = field(default_factory=list)
    call: dict[str, Any] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "kind": self.kind, "kernel": self.kernel,
                "failure": self.failure, "world": self.world.to_json() if self.world else None,
                "program": self.program, "call": self.call, "provenance": self.provenance}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Case":
        if data.get("format") != FORMAT:
            raise ValueError(f"not a blocktable case file (format {data.get('format')!r})")
        if data.get("version") != VERSION:
            raise ValueError(f"case file version {data.get('version')} is not supported (this blocktable reads "
                             f"version {VERSION})")
        if data.get("kind") not in ("lockstep", "slot-call"):
            raise ValueError(f"unknown case kind {data.get('kind')!r}")
        world = WorldConfig.from_json(data["world"]) if data.get("world") else None
        return cls(kind=data["kind"], kernel=data["kernel"], failure=data.get("failure", {}), world=world,
                   program=list(data.get("program") or []), call=data.get("call"),
                   provenance=data.get("provenance", {}))

    def digest(self) -> str:
        body = json.dumps({"kind": self.kind, "world": self.world.to_json() if self.world else None,
                           "program": self.program, "call": self.call}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:10]

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        stem = "".join(c if c.isalnum() else "-" for c in Path(self.kernel.split(":")[-1]).name)[:40]
        path = folder / f"case-{stem}-{self.digest()}.json"
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path


def load(path: str | Path) -> Case:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"case file {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"case file {path} is not valid JSON: {e}") from None
    return Case.from_json(data)
