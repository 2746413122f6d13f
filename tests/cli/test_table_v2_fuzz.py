"""`blocktable fuzz --table-v2 CLASS` (docs/contract.md §11): a V2 table class drives
every world's V2 tables (every world keeps them); ours passes through the class path;
a one-line bug planted in a class is found, shrunk, confirmed in a fresh process,
saved as a case that names the class, and replayed (exit 1 while the bug is there, 0
with `replay --table-v2` naming the fixed class)."""

import json

import pytest

from blocktable.properties.cases.case import load

pytestmark = pytest.mark.fuzz

# Our V2 tables through the protocol, with the overwrite flag of every append dropped:
# a copy-on-write or a resumed request appends its whole list after the stale one.
DROPPED = '''from blocktable.classes.table_v2 import TableV2


class Dropped(TableV2):
    def append_block_ids(self, r, new_block_ids, overwrite):
        super().append_block_ids(r, new_block_ids, {flag})
'''


def test_ours_through_the_class_path_passes_in_every_world(cli, numpy_slots):
    code, out = cli("fuzz", "--table-v2", "ours", *numpy_slots, "--device", "cpu", "--examples", "10")
    assert code == 0 and "table-v2 ours" in out and "no discrepancy found" in out, out
    calls = next(line for line in out.splitlines() if "calls" in line)
    assert "table-v2 " in calls and "v2-append" not in calls, calls  # the class's own kernels, not ours
    assert "V2 append with overwrite" in out


def test_a_planted_bug_is_found_shrunk_confirmed_and_replays(cli, tmp_path, case_file, numpy_slots):
    bug, fix = tmp_path / "dropped.py", tmp_path / "fixed.py"
    bug.write_text(DROPPED.format(flag="False"))
    fix.write_text(DROPPED.format(flag="overwrite"))
    spec = f"{bug}:Dropped"
    code, out = cli("fuzz", "--table-v2", spec, *numpy_slots, "--device", "cpu", "--examples", "2000", "--seed", "0")
    assert code == 1, out
    # An append that drops its overwrite shows as a wrong count or as a stale row,
    # whichever the draws meet first (they differ with Hypothesis's version).
    symptom = next((s for s in ("V2 host counts", "V2 persistent rows") if s in out), None)
    assert "blocktable found a discrepancy" in out and symptom is not None, out
    assert "confirmed: it fails again when replayed alone in a fresh process" in out
    assert f"--table-v2 {spec}" in out
    case = case_file(out)
    data = json.loads(case.read_text())
    assert data["classes"] == {"table-v2": "../dropped.py:Dropped"} and load(case).classes == {"table-v2": spec}
    assert len(data["program"]) <= 12, data["program"]  # shrunk
    code, replayed = cli("replay", str(case))
    assert code == 1 and symptom in replayed, replayed
    code, replayed = cli("replay", str(case), "--table-v2", f"{fix}:Dropped")
    assert code == 0 and "passes now" in replayed, replayed


@pytest.mark.parametrize("args, said", [
    (["--table-v2", "mine"], "unknown V2 table class 'mine'"),
    (["--table-v2", "ours", "--stateless"], "--stateless does not run"),
    (["--table-v2", "ours", "--v2-slots", "triton"], "drop --v2-slots"),
])
def test_a_v2_table_named_wrongly_is_a_one_line_usage_error(cli, args, said):
    code, out = cli("fuzz", *args, "--device", "cpu", "--examples", "3")
    assert code == 2 and said in out, out
    assert len(out.strip().splitlines()) == 1, out
