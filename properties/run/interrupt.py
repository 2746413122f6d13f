"""A run stopped by Ctrl-C: what it keeps. The children ignore SIGINT (child.py), so
the parent alone is interrupted; it stops them, and each crash journal still holds
the program its child was running, which becomes a case file (not confirmed, not
shrinking: the user asked the run to stop). A program that hung is then one
`blocktable replay` away. A stateless batch is not journaled whole: it keeps nothing."""

from __future__ import annotations

from pathlib import Path

from blocktable.properties.cases.case import Case, provenance
from blocktable.properties.run.journal import Journal
from blocktable.properties.world import WorldConfig


def _case(journal: Path, kv: dict[str, str]) -> Case | None:
    """The case of the program a journal holds; None where there is none to replay."""
    try:
        header, steps = Journal.read(journal)
    except (OSError, ValueError):
        return None
    kind = header.get("kind")
    where = f"during step {len(steps)}" if steps else "before its first step"
    failure = {"what": "interrupted", "message": f"interrupted (Ctrl-C) {where}",
               "step": len(steps) - 1 if steps else None}
    prov = provenance(header.get("device", "unknown"), interrupted=True,
                      **({"replay_device": header["replay_device"]} if "replay_device" in header else {}))
    if kind in ("slot-call", "kv-call"):
        failure["message"] = f"interrupted (Ctrl-C) while running {header['call'].get('name', 'a call')}"
        failure["step"] = None
        return Case(kind, header["kernel"], failure, call=header["call"], provenance=prov)
    if kind != "lockstep" or not steps:  # a stateless batch, or a program with no step to replay
        return None
    return Case("lockstep", header["kernel"], failure, world=WorldConfig.from_json(header["world"]), program=steps,
                provenance=prov, kv=dict(kv))


def keep_journals(journals: list[Path], out: Path, kv: dict[str, str]) -> list[Path]:
    """Each journal that holds a program turned into a case file in `out`; every
    journal removed. The case files written, in the journals' order."""
    kept = []
    for journal in journals:
        case = _case(journal, kv)
        if case is not None:
            kept.append(case.save(out))
        journal.unlink(missing_ok=True)
    return kept
