"""Running one mutant: copy the installed package into a scratch folder (the
working tree is never edited), apply the mutant, and run the ci-profile fuzzing
against it in a subprocess whose PYTHONPATH puts the mutated copy first.

The worker streams the fuzz engine's messages as JSON lines; a worker that dies
after reporting a failure, or dies at all, has been killed by the harness too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from blocktable.properties.mutation.catalogue import Mutant
from blocktable.properties.run.journal import Journal
from blocktable.properties.run.messages import Job, Progress, Result, from_json, job_to_json
from blocktable.properties.run.workers import Placement

SUBPACKAGES = ("reference", "kernels", "properties")


def package_dirs() -> dict[str, Path]:
    """Where the installed package's four folders are (editable or not)."""
    import blocktable
    import blocktable.kernels
    import blocktable.properties
    import blocktable.reference

    return {"blocktable": Path(blocktable.__file__).parent,
            **{f"blocktable/{name}": Path(getattr(blocktable, name).__file__).parent for name in SUBPACKAGES}}


def build_tree(dest: Path) -> Path:
    """dest/blocktable laid out as an installed package. Returns dest."""
    ignore = shutil.ignore_patterns("__pycache__", *SUBPACKAGES)
    dirs = package_dirs()
    shutil.copytree(dirs["blocktable"], dest / "blocktable", ignore=ignore)
    for name in SUBPACKAGES:
        shutil.copytree(dirs[f"blocktable/{name}"], dest / "blocktable" / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def snippet_count(mutant: Mutant, root: Path) -> int:
    return (root / mutant.path).read_text().count(mutant.old)


def apply(mutant: Mutant, root: Path) -> None:
    path = root / mutant.path
    source = path.read_text()
    if source.count(mutant.old) != 1:
        raise ValueError(f"mutant {mutant.id}: its snippet occurs {source.count(mutant.old)} times in "
                         f"{mutant.path}, not once (the code changed; update the catalogue)")
    path.write_text(source.replace(mutant.old, mutant.new))


@dataclass
class Verdict:
    id: str
    layer: str
    imitates: str
    killed: bool | None  # None: equivalent, not run
    seconds_to_kill: float | None = None
    examples_to_kill: int | None = None
    shrunk_steps: int | None = None
    by: str = ""  # what detected it
    seconds: float = 0.0  # the whole run, shrinking included
    equivalent: str | None = None
    unreached: str | None = None  # why this backend cannot reach the mutated code (not run)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_mutant(mutant: Mutant, budget: float, seed: int = 0, device: str = "auto",
               place: Placement | None = None) -> Verdict:
    """Fuzz one mutant in a fresh interpreter whose path puts the mutated copy first
    (a spawned multiprocessing child would import the installed package: it
    re-imports the parent's main module). `place`: the fuzz workers' placement
    (run/workers.py), its threads and core."""
    verdict = Verdict(mutant.id, mutant.layer, mutant.imitates, killed=None, equivalent=mutant.equivalent)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.id}-") as scratch:
        root = build_tree(Path(scratch) / "tree")
        apply(mutant, root)
        ours = mutant.env.get("BLOCKTABLE_V2_KERNELS", "torch")
        job = Job(mutant.kernel, device=device, minutes=budget / 60, seed=seed, profile="ci",
                  out=str(Path(scratch) / "cases"), journal=str(Path(scratch) / "journal.jsonl"),
                  expect_root=str(root), v2=dict.fromkeys(mutant.stateless_v2, ours), classes=dict(mutant.classes))
        env = {**os.environ, **(place.env if place else {}), "PYTHONPATH": str(root), "BLOCKTABLE_PROFILE": "ci",
               **mutant.env}
        process = subprocess.Popen([sys.executable, "-m", "blocktable.properties.mutation.worker",
                                    json.dumps(job_to_json(job))],
                                   cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if place is not None and place.core is not None:
            try:  # at once, before the worker starts threads of its own (they inherit it)
                os.sched_setaffinity(process.pid, {place.core})
            except (AttributeError, OSError):
                pass
        messages = []
        timed_out = False
        try:
            out, err = process.communicate(timeout=budget + 300)  # shrinking may outlast the budget
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            timed_out = True
        for line in out.splitlines():
            try:
                messages.append(from_json(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # not a message: something the code under test printed
        died = _journal_position(Path(scratch) / "journal.jsonl")
    verdict.seconds = time.monotonic() - start
    result = next((m for m in reversed(messages) if isinstance(m, Result)), None)
    if result is not None and result.status == "pass":
        verdict.killed = False
        return verdict
    if result is not None and result.status == "config-error":
        verdict.killed, verdict.by = False, f"worker could not start: {result.message}"
        return verdict
    verdict.killed = True
    stats = result.stats if result is not None else next(
        (m.stats for m in reversed(messages) if isinstance(m, Progress)), None)
    if stats is not None:
        verdict.seconds_to_kill = stats.first_failure_s
        verdict.examples_to_kill = stats.examples_to_failure
    if result is None and timed_out and (stats is None or stats.first_failure_s is None):
        # Stopped by the gate, not by a finding: the harness did not kill it.
        verdict.killed = False
        verdict.by = f"no failure within the budget; the worker was stopped {budget + 300:.0f} s in"
        return verdict
    if result is None and timed_out:
        verdict.by = (f"a failure at {stats.first_failure_s:.1f} s; its shrinking outlasted the gate's limit "  # type: ignore[union-attr]
                      f"({budget + 300:.0f} s), and the worker was stopped")
        return verdict
    if result is None:
        verdict.by = f"the worker died (exit {process.returncode}) {died.text}"
        if verdict.examples_to_kill is None and died.contract_example:
            verdict.examples_to_kill = 0  # the examples come before any generated input
        if verdict.seconds_to_kill is None:
            verdict.seconds_to_kill = verdict.seconds
        return verdict
    failure = result.failure
    if failure is None:  # a "fail" result always carries its failure
        verdict.by = "the worker reported a failure without details"
        return verdict
    verdict.shrunk_steps = failure.program_steps
    verdict.by = (failure.error or failure.what)[:160]
    if failure.kind == "slot-call":
        verdict.by = f"contract example {failure.call}: {verdict.by}"
    return verdict


@dataclass(frozen=True)
class Position:
    """Where a dead worker was, from its crash journal."""

    text: str
    contract_example: bool = False  # in a contract example, before any generated input


def _journal_position(journal: Path) -> Position:
    try:
        header, steps = Journal.read(journal)
    except (OSError, ValueError):
        return Position("before its first step")
    if header.get("kind") == "slot-call":
        return Position(f"during contract example {header['call'].get('name')}", contract_example=True)
    return Position(f"during step {len(steps)} of a lockstep run" if steps else "while building a lockstep world")
