"""`blocktable fuzz --pool CLASS` (docs/contract.md §11): the example pool class
(examples/pool_class.py) passes the lockstep; a one-line bug planted in it is found,
shrunk, confirmed in a fresh process, saved as a case that names the class, and
replayed (exit 1 while the bug is there, 0 with `replay --pool` naming the fixed
class). Mistakes in naming a class are one-line usage errors."""

import json
import shutil
from pathlib import Path

import pytest

from blocktable.properties.cases.case import load

pytestmark = pytest.mark.fuzz

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pool_class.py"
LIST_POOL = "pool_class.py:ListPool"
# (the one-line edit planted, the seed whose programs find it soon, what the report says).
# The seeds were picked by trying 1-5 (2026-12-03). Time a seed with a fresh example
# database each run: a second run in the same folder tries the saved failure first and
# finds it in 2 programs. So timed, on the 2-core CPU (2026-12-04), "vLLM order
# reversed" takes 29-89 s for seeds 1-6; seed 4 finds it at program 71 (10.8 s in) and
# shrinks it in 550 more (25 s in all, 2026-12-04). Another seed finds the same bug,
# later: a change to what the lockstep draws may call for picking again.
PLANTED = {
    # vLLM #42571: a block listed twice in one free is queued twice.
    "duplicate free accepted": (("        if len(set(ids)) != len(ids):", "        if False:"), 4,
                                "rejection free-duplicate"),
    # The vLLM order taken one block at a time: the head reads the freed blocks reversed.
    "vLLM order reversed": (("            self.queue[:0] = [b for b in released if b not in self.key_of]",
                             "            self.queue[:0] = [b for b in released if b not in self.key_of][::-1]"),
                            4, "pool free queue"),
}
TAIL_ONLY = ("    free_orders = (\"tail\", \"vllm\")", "    free_orders = (\"tail\",)")


def test_the_example_class_passes_and_is_called(cli, plant_example, numpy_slots):
    spec = plant_example(LIST_POOL)
    code, out = cli("fuzz", "--pool", spec, *numpy_slots, "--device", "cpu", "--examples", "30")
    assert code == 0, out
    assert "no discrepancy found" in out and f"pool {spec}" in out
    assert "first failing program" not in out, out
    calls = next(line for line in out.splitlines() if "calls" in line)
    assert "pool " in calls and "pool 0" not in calls, calls


def test_ours_through_the_class_path_passes(cli, numpy_slots):
    code, out = cli("fuzz", "--pool", "ours", *numpy_slots, "--device", "cpu", "--examples", "30")
    assert code == 0 and "pool ours" in out, out


@pytest.mark.parametrize("bug", PLANTED)
def test_a_planted_bug_is_found_shrunk_confirmed_and_replays(cli, plant_example, case_file, numpy_slots, bug):
    edit, seed, said = PLANTED[bug]
    spec = plant_example(LIST_POOL, edit)
    code, out = cli("fuzz", "--pool", spec, *numpy_slots, "--device", "cpu", "--examples", "2000", "--seed", str(seed))
    assert code == 1, out
    assert "blocktable found a discrepancy" in out and said in out, out
    assert "confirmed: it fails again when replayed alone in a fresh process" in out
    assert "first failing program" in out and "the rest is shrinking" in out, out
    assert f"--pool {spec}" in out  # the replay line names the class by its flag
    case = case_file(out)
    data = json.loads(case.read_text())
    assert data["kind"] == "lockstep" and data["classes"] == {"pool": "../pool_class.py:ListPool"}
    assert load(case).classes == {"pool": spec} and case.name.startswith("case-pool-class-ListPool-")
    assert len(data["program"]) <= 12, data["program"]  # shrunk
    code, replayed = cli("replay", str(case))
    assert code == 1 and said in replayed, replayed
    code, replayed = cli("replay", str(case), "--pool", f"{EXAMPLE}:ListPool")
    assert code == 0 and "passes now" in replayed, replayed
    if bug == "vLLM order reversed":  # its world frees in vLLM's order: a tail-only class cannot replay it
        tail_only = plant_example(LIST_POOL, TAIL_ONLY, name="tail_only.py")
        code, replayed = cli("replay", str(case), "--pool", tail_only)
        assert code == 2 and "declares free_orders ('tail',)" in replayed, replayed
        assert len(replayed.strip().splitlines()) == 1, replayed
    shutil.copyfile(EXAMPLE, spec.rpartition(":")[0])  # the fix, in the recorded file
    code, replayed = cli("replay", str(case))
    assert code == 0, replayed


@pytest.mark.parametrize("args, said", [
    (["--pool", "nope.py:ListPool"], "pool class file nope.py does not exist"),
    (["--pool", "mine"], "unknown pool class 'mine'"),
    (["--pool", "ours", "--stateless"], "--stateless does not run"),
])
def test_a_class_named_wrongly_is_a_one_line_usage_error(cli, args, said):
    code, out = cli("fuzz", *args, "--device", "cpu", "--examples", "3")
    assert code == 2 and said in out, out
    assert len(out.strip().splitlines()) == 1, out


def test_a_class_that_breaks_the_protocol_is_refused_before_anything_runs(cli, plant_example):
    spec = plant_example(LIST_POOL, ("    def touch(self, ids):", "    def touch(self):"))
    code, out = cli("fuzz", "--pool", spec, "--device", "cpu", "--examples", "3")
    assert code == 2 and "ListPool.touch" in out and "the contract passes 1 (ids)" in out, out


def test_a_tail_only_class_runs_tail_worlds_only(cli, plant_example, numpy_slots):
    code, out = cli("fuzz", "--pool", plant_example(LIST_POOL, TAIL_ONLY), *numpy_slots, "--device", "cpu",
                    "--examples", "30")
    assert code == 0, out
    assert "vLLM-order free" not in out and "no discrepancy found" in out, out
