"""`blocktable fuzz --table CLASS` (docs/contract.md §11): the example table class
(examples/table_class.py) passes the lockstep, and so does ours through the class
path; a one-line bug planted in the example is found, shrunk, confirmed in a fresh
process, saved as a case that names the class, and replayed (exit 1 while the bug
is there, 0 with `replay --table` naming the fixed class). A table class computes
its own slot mappings, so no slot-mapping kernel is named beside it."""

import json
import re
import shutil
from pathlib import Path

import pytest

from blocktable.properties.cases.case import load

pytestmark = pytest.mark.fuzz

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "table_class.py"
NUMPY_TABLE = "table_class.py:NumpyTable"
# (the one-line edit planted, the seed whose programs find it soon, the step that must
# fail: a regular expression, and whether only the object of DCP rank 1 is wrong). Which
# part of the table the report names first (host rows, counts or device rows) is not
# asserted: the bug shows in several, and the program that finds it first may change
# with anything that changes the programs drawn.
# The seed: each bug's first failing program comes within 1-2 s under most seeds; the rest
# of a run is Hypothesis shrinking it, which the seed decides. Timed with a fresh folder
# each (`fuzz --table ... --device cpu --examples 2000 --seed S`, two at once on the
# 2-core CPU, 2026-12-06), seeds 0-7: self-move 26.6, 10.2, 10.5, 31.3, 35.4, 22.2, 11.4,
# 12.9 s; one rank 41.4, 36.0, 36.6, 38.5, 32.7, 21.8, 32.4, 46.7 s.
PLANTED = {
    # move_row(a, a) copies the row onto itself and then clears the source: the row is wiped.
    "self-move wipes the row": (("        if src == dst:\n            return\n", "        if False:\n            return\n"),
                                1, r"move src=(\d+) dst=\1", False),
    # Swapping numpy rows by tuple assignment: the right side holds views, so both rows end up b's.
    "swap through views": (("            group.host[[a, b]] = group.host[[b, a]]",
                            "            group.host[a], group.host[b] = group.host[b], group.host[a]"),
                           4, r"swap a=(\d+) b=(?!\1\b)\d+", False),
    # Only the object of DCP rank 1 wipes a self-moved row: each rank's object is compared.
    "one rank wipes its self-moved row": (("        if src == dst:\n", "        if src == dst and self.rank == 0:\n"),
                                          5, r"move src=(\d+) dst=\1", True),
}
FAILURE = re.compile(r"^\s*failure at step \d+: Discrepancy: group \d+ table (host rows|row counts|device rows): .*$",
                     re.MULTILINE)
FAILING_STEP = re.compile(r"^\s+\d+\. (.*?)  <- fails here$", re.MULTILINE)
RANK_NOTE = "(in the table object built for cp_rank 1)"


def test_the_example_class_passes_and_is_called(cli, plant_example):
    spec = plant_example(NUMPY_TABLE)
    code, out = cli("fuzz", "--table", spec, "--device", "cpu", "--examples", "30")
    assert code == 0, out
    assert "no discrepancy found" in out and f"table {spec}" in out
    calls = next(line for line in out.splitlines() if "calls" in line)
    assert "table " in calls and "kernel " not in calls, calls  # the class computes its own slot mappings


def test_ours_through_the_class_path_passes(cli):
    code, out = cli("fuzz", "--table", "ours", "--device", "cpu", "--examples", "30")
    assert code == 0 and "table ours" in out, out


@pytest.mark.parametrize("bug", PLANTED)
def test_a_planted_bug_is_found_shrunk_confirmed_and_replays(cli, plant_example, case_file, bug):
    edit, seed, step, rank_one = PLANTED[bug]
    spec = plant_example(NUMPY_TABLE, edit)
    code, out = cli("fuzz", "--table", spec, "--device", "cpu", "--examples", "2000", "--seed", str(seed))
    assert code == 1, out
    assert "blocktable found a discrepancy" in out and f"  kernel:  table {spec}\n" in out, out
    failure = FAILURE.search(out)
    assert failure is not None, out
    failing = FAILING_STEP.findall(out)
    assert len(failing) == 1 and re.fullmatch(step, failing[0]), failing  # the bug's own operation
    assert (RANK_NOTE in out) == rank_one, out
    assert "confirmed: it fails again when replayed alone in a fresh process" in out
    replay_line = next(line for line in out.splitlines() if line.startswith("replay: "))
    assert f"--table {spec}" in replay_line and "--kernel" not in replay_line, replay_line
    case = case_file(out)
    data = json.loads(case.read_text())
    assert data["kind"] == "lockstep" and data["classes"] == {"table": "../table_class.py:NumpyTable"}
    assert load(case).classes == {"table": spec} and case.name.startswith("case-table-class-NumpyTable-")
    assert len(data["program"]) <= 12, data["program"]  # shrunk
    code, replayed = cli("replay", str(case))
    assert code == 1 and failure.group(0) in replayed.splitlines(), replayed  # the same failure, word for word
    code, replayed = cli("replay", str(case), "--table", f"{EXAMPLE}:NumpyTable")
    assert code == 0 and f"passes now with table {EXAMPLE}:NumpyTable" in replayed, replayed  # no kernel named
    code, replayed = cli("replay", str(case), "--kernel", "triton-per-request")
    assert code == 2 and "drop --kernel triton-per-request" in replayed, replayed
    shutil.copyfile(EXAMPLE, spec.rpartition(":")[0])  # the fix, in the recorded file
    code, replayed = cli("replay", str(case))
    assert code == 0, replayed


@pytest.mark.parametrize("args, said", [
    (["--table", "nope.py:NumpyTable"], "table class file nope.py does not exist"),
    (["--table", "mine"], "unknown table class 'mine'"),
    (["--table", "ours", "--stateless"], "--stateless does not run"),
    (["--table", "ours", "--kernel", "triton-per-request"], "drop --kernel triton-per-request"),
])
def test_a_table_named_wrongly_is_a_one_line_usage_error(cli, args, said):
    code, out = cli("fuzz", *args, "--device", "cpu", "--examples", "3")
    assert code == 2 and said in out, out
    assert len(out.strip().splitlines()) == 1, out


def test_a_table_that_breaks_the_protocol_is_refused_before_anything_runs(cli, plant_example):
    spec = plant_example(NUMPY_TABLE, ("    def move_row(self, src, dst):", "    def move_row(self, src):"))
    code, out = cli("fuzz", "--table", spec, "--device", "cpu", "--examples", "3")
    assert code == 2 and "NumpyTable.move_row" in out and "the contract passes 2 (src, dst)" in out, out


def test_a_class_declaring_uniform_groups_runs_uniform_worlds_only(cli, plant_example):
    # As vLLM's V1 table: one DCP world and one interleave for every group. This copy
    # refuses anything else in its constructor, which the lockstep would report.
    spec = plant_example(NUMPY_TABLE, ("class NumpyTable:\n", "class NumpyTable:\n    uniform_groups = True\n"), (
        "        self.max_num_reqs = max_num_reqs\n",
        "        self.max_num_reqs = max_num_reqs\n"
        "        if cp_world_size > 1:\n"
        "            assert all(sharded) and len(set(cp_interleave)) == 1, (sharded, cp_interleave)\n"))
    code, out = cli("fuzz", "--table", spec, "--device", "cpu", "--examples", "40", "--seed", "3")
    assert code == 0 and "no discrepancy found" in out, out
    assert "non-local DCP tokens" in out  # DCP worlds were among them
