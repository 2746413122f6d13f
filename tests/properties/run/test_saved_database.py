"""Example databases that fleets saved stay in use after an upgrade. Hypothesis keys a
stateful test's entries by the machine class's source text (and its own), so:

1. the class text is the one this version saves its databases with (the file beside
   this test), so that a change to it, which moves every entry to a new key, is made
   on purpose and said in the changelog and docs/fleet.md. 0.2.0 changed it (the
   next-turn rule's `others`, issue 30), after 0.1.0 (machine-0.1.0.txt, kept as
   the record): 0.1.0's entries are no longer replayed, where they would have
   decoded as other programs anyway (0.2.0 changes the draws too);
2. a database saved with this version's draws, with a planted bug it found, is
   replayed as the very first program of another seed's run.

An entry is a choice sequence, not a program: where a release changes what the
worlds draw (0.2.0: the prefix worlds' fresh admission and token ids, the V2
worlds), an older entry is still replayed first but decodes as another program, so
a finding saved before does not recur from it (docs/fleet.md says so). 0.1.0's
database is kept beside this one, as the record of that.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

import hypothesis
import pytest

from blocktable.properties.lockstep.machine import make_machine
from blocktable.properties.run.child import run_in_child
from blocktable.properties.run.fuzz import fuzz_child
from blocktable.properties.run.messages import Job

pytestmark = pytest.mark.fuzz

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "numpy_slot_mapping.py"
LINE = "        out[first:last] = np.where(ok, block * B + local % B, -1)"
BUG = LINE + "\n        if request == 3:\n            out[first:last] = np.where(ok, block * B + (local + 1) % B, -1)"


def test_the_machine_class_text_is_the_one_databases_were_saved_with(kernels, backend):
    machine = make_machine(kernels("reference"), backend)
    assert inspect.getsource(machine) == (DATA / "machine-0.2.0.txt").read_text()


def test_a_saved_database_is_replayed_first(tmp_path):
    saved = json.loads((DATA / "database-0.2.0.json").read_text())
    database = tmp_path / "db"
    shutil.copytree(DATA / "database-0.2.0", database)
    folder = tmp_path / "k"  # the same file name as when it was saved: the same entries
    folder.mkdir()
    source = EXAMPLE.read_text()
    assert source.count(LINE) == 1
    (folder / "kernel.py").write_text(source.replace(LINE, BUG))
    out = tmp_path / "out"
    job = Job(f"{folder / 'kernel.py'}:slot_mapping", device="cpu", examples=200, seed=2, out=str(out),
              journal=str(out / "journal.jsonl"), database=str(database))
    result = run_in_child(fuzz_child, job).result
    assert result is not None and result.status == "fail" and result.stats is not None
    if result.stats.examples_to_failure != 1 and hypothesis.__version__ != saved["hypothesis"]:
        pytest.skip(f"Hypothesis {hypothesis.__version__} keys stateful tests differently from "
                    f"{saved['hypothesis']}, which saved this database (its own source is part of the key)")
    assert result.stats.examples_to_failure == 1
