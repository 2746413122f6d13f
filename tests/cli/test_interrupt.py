"""Ctrl-C reaches the whole process group. `blocktable fuzz` then exits 130 with one
line on stderr saying what it kept (no traceback from any process), and the
program each child was running is a case file that replays; no journal is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blocktable.properties.cases.case import load
from blocktable.properties.run.interrupt import keep_journals
from blocktable.properties.run.journal import Journal

pytestmark = pytest.mark.fuzz


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "numpy_slot_mapping.py"
BODY = "    K, B, W, R, I = kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave\n"
# After the 30 contract examples, at a call in a lockstep step, the kernel says so in a
# file and never returns: the program it hangs in is the one Ctrl-C must keep.
HANG = ("    CALLS.append(1)\n    if len(CALLS) > 60:\n"
        "        (Path(os.environ['HANG_FOLDER']) / str(os.getpid())).touch()\n        time.sleep(3600)\n")


def hanging_kernel(folder: Path) -> str:
    source = EXAMPLE.read_text()
    assert source.count(BODY) == 1
    source = "import os\nimport time\nfrom pathlib import Path\n\nCALLS = []\n" + source.replace(BODY, HANG + BODY)
    (folder / "hangs.py").write_text(source)
    return f"{folder / 'hangs.py'}:slot_mapping"


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_to_the_process_group_exits_130_saying_what_was_kept(tmp_path, jobs):
    hung = tmp_path / "hung"
    hung.mkdir()
    command = [sys.executable, "-m", "blocktable.cli.main", "fuzz", "--kernel", hanging_kernel(tmp_path),
               "--device", "cpu", "--minutes", "10", "--jobs", str(jobs), "--out", "cases"]
    # As a terminal starts a command in the foreground: SIGINT at its default, even where
    # this test runs with it ignored (a background job of a script, which every child
    # inherits; Python then installs no KeyboardInterrupt at all).
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                           start_new_session=True, env={**os.environ, "HANG_FOLDER": str(hung)},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while len(list(hung.iterdir())) < jobs and run.poll() is None:  # every child hangs in a step now
            time.sleep(0.1)
        assert run.poll() is None, run.communicate()
        os.killpg(run.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, err
    assert "Traceback" not in out + err and "leaked" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blocktable fuzz: interrupted (Ctrl-C); kept the program that "
                                                   "was running as cases/case-hangs-slot-mapping-"), err
    cases = sorted((tmp_path / "cases").glob("case-*.json"))
    assert len(cases) == jobs and not list((tmp_path / "cases").glob("journal*"))
    for path in cases:
        case = load(path)
        assert case.kind == "lockstep" and case.failure["what"] == "interrupted" and case.program
        assert case.failure["message"] == f"interrupted (Ctrl-C) during step {len(case.program)}"
        assert case.program[-1]["op"] == "step"  # the step it hung in, journaled before it ran
        assert case.provenance["interrupted"] is True and case.confirmation is None


def test_a_journal_without_a_program_to_replay_keeps_nothing(tmp_path):
    stateless, empty = tmp_path / "journal-1.jsonl", tmp_path / "journal-2.jsonl"
    journal = Journal(stateless)
    journal.start({"kind": "stateless-batch", "kernel": "triton", "batch": 3})
    journal.close()
    journal = Journal(empty)
    journal.start({"kind": "lockstep", "kernel": "triton", "world": {}})
    journal.close()
    assert keep_journals([stateless, empty, tmp_path / "missing.jsonl"], tmp_path, {}) == []
    assert list(tmp_path.iterdir()) == []
