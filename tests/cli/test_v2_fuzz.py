"""`blocktable fuzz --stateless --v2-*` against the example V2 block-table plug-ins
(examples/torch_v2_*.py): each passes as written; one planted bug in each is found,
shrunk to one append, request or token, reported with the element decoded, saved as
a "v2-call" case, confirmed in a fresh process, and replayed (exit 1 while the bug is
there, 0 once it is fixed, by the file or by `replay --v2-KIND`)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from blocktable.properties.cases.case import load

pytestmark = pytest.mark.fuzz

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KINDS = {"append": ("torch_v2_append.py", "append"), "gather": ("torch_v2_gather.py", "gather"),
         "slots": ("torch_v2_slots.py", "slot_mappings")}
# (kind, the one-line edit planted, what the shrunk call holds, what the report says)
PLANTED = {
    # The host's start is 0 for an overwrite; writing from the device count ignores it.
    "overwrite ignored": ("append", ("        ids = staged_ids[ends[i]:ends[i + 1]]",
                                     "        ids, start = staged_ids[ends[i]:ends[i + 1]], max(start, int(cnt_dev[g, r]))"),
                          lambda call: len(call["appends"]) == 1 and call["appends"][0]["overwrite"],
                          "overwrite, so from column 0"),
    "gathered by batch index": ("gather", ("source = slot.clamp(min=0)", "source = torch.arange(n, device=slot.device)"),
                                lambda call: len(call["idx_mapping"]) == 1, "batch index 0, slot "),
    # vLLM #51031: ownership decided on kernel blocks (VB = B * W).
    "ownership in kernel blocks": ("slots", ("block = K ", "block = B "),
                                   lambda call: len(call["idx_mapping"]) == 1 and call["query_start_loc"][1] == 1,
                                   "owned by rank"),
}


def plant(tmp_path, kind, edit=None):
    name, function = KINDS[kind]
    source = (EXAMPLES / name).read_text()
    if edit is not None:
        old, new = edit
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    path = tmp_path / name
    path.write_text(source)
    return f"{path}:{function}"


def case_of(out):
    return Path(out.split("case file: ")[1].split()[0])


@pytest.mark.parametrize("kind", KINDS)
def test_each_example_passes_20_calls(cli, tmp_path, kind):
    spec = plant(tmp_path, kind)
    code, out = cli("fuzz", "--stateless", f"--v2-{kind}", spec, "--device", "cpu", "--examples", "20")
    assert code == 0, out
    assert "no discrepancy found" in out and f"v2-{kind} {spec}" in out and "20 / " in out


def test_the_three_examples_at_once_make_n_calls_of_each(cli, tmp_path):
    specs = [plant(tmp_path, kind) for kind in KINDS]
    flags = [x for kind, spec in zip(KINDS, specs) for x in (f"--v2-{kind}", spec)]
    code, out = cli("fuzz", "--stateless", *flags, "--device", "cpu", "--examples", "5")
    assert code == 0, out
    assert "15 / " in out  # 5 rounds of 3 calls


@pytest.mark.parametrize("bug", PLANTED)
def test_a_planted_bug_is_found_shrunk_confirmed_and_replays(cli, tmp_path, bug):
    kind, edit, shrunk, said = PLANTED[bug]
    spec = plant(tmp_path, kind, edit)
    code, out = cli("fuzz", "--stateless", f"--v2-{kind}", spec, "--device", "cpu", "--examples", "20")
    assert code == 1, out
    assert "blocktable found a discrepancy" in out and "first differing element:" in out and said in out, out
    assert "confirmed: it fails again when replayed alone in a fresh process" in out
    assert f"--v2-{kind} {spec}" in out  # the replay command names the plug-in by its flag
    case = case_of(out)
    data = json.loads(case.read_text())
    assert data["kind"] == "v2-call" and load(case).kernel == spec and data["call"]["op"] == kind
    assert data["kernel"] == f"../{KINDS[kind][0]}:{KINDS[kind][1]}"  # stored relative to the case file
    assert shrunk(data["call"]), data["call"]
    code, replayed = cli("replay", str(case))
    assert code == 1 and said in replayed, replayed
    code, replayed = cli("replay", str(case), f"--v2-{kind}", str(EXAMPLES / KINDS[kind][0]) + f":{KINDS[kind][1]}")
    assert code == 0, replayed
    shutil.copyfile(EXAMPLES / KINDS[kind][0], spec.rpartition(":")[0])  # the fix, in the recorded file
    code, replayed = cli("replay", str(case))
    assert code == 0, replayed


def test_the_report_names_the_decoded_element(cli, tmp_path):
    kind, edit, _, _ = PLANTED["gathered by batch index"]
    code, out = cli("fuzz", "--stateless", "--v2-gather", plant(tmp_path, kind, edit), "--device", "cpu",
                    "--examples", "20")
    assert code == 1, out
    lines = out.splitlines()
    where = lines[lines.index("  first differing element:") + 1]
    assert where.startswith("    inp of group 0, batch index 0, slot ") and ", column " in where, where
    assert "copied from column" in out or "a dummy" in out


def test_replay_refuses_a_v2_flag_the_case_never_calls(cli, tmp_path):
    kind, edit, _, _ = PLANTED["gathered by batch index"]
    _, out = cli("fuzz", "--stateless", "--v2-gather", plant(tmp_path, kind, edit), "--device", "cpu",
                 "--examples", "20")
    code, replayed = cli("replay", str(case_of(out)), "--v2-slots", "torch")
    assert code == 2 and "never calls" in replayed


def test_a_malformed_v2_case_is_refused_before_anything_runs(cli, tmp_path):
    kind, edit, _, _ = PLANTED["ownership in kernel blocks"]
    _, out = cli("fuzz", "--stateless", "--v2-slots", plant(tmp_path, kind, edit), "--device", "cpu",
                 "--examples", "20")
    data = json.loads(case_of(out).read_text())
    data["call"]["query_start_loc"] = [0, 5]  # five tokens, one position
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    code, replayed = cli("replay", str(bad))
    assert code == 2 and "call: the reference refuses it" in replayed, replayed


def test_kv_and_v2_flags_together_are_refused_in_the_stateless_mode(cli, tmp_path):
    code, out = cli("fuzz", "--stateless", "--v2-gather", "torch", "--kv-write", "torch", "--device", "cpu")
    assert code == 2 and "not both in one run" in out


def test_an_emitted_v2_test_fails_on_the_bug_and_passes_on_the_fix(cli, tmp_path):
    kind, edit, _, _ = PLANTED["overwrite ignored"]
    spec = plant(tmp_path, kind, edit)
    _, out = cli("fuzz", "--stateless", "--v2-append", spec, "--device", "cpu", "--examples", "20")
    code, out = cli("replay", str(case_of(out)), "--emit-test", str(tmp_path / "regress"))
    assert code == 1, out

    def pytest_exit() -> int:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "regress")]
        return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path).returncode

    assert pytest_exit() == 1
    shutil.copyfile(EXAMPLES / KINDS[kind][0], spec.rpartition(":")[0])
    assert pytest_exit() == 0


def test_a_crash_in_a_stateless_v2_call_says_which_and_how_to_repeat_it(cli, tmp_path):
    path = tmp_path / "dies.py"
    path.write_text("import os\nimport signal\n\n\ndef gather(rows, cnt_dev, inp, idx_mapping, num_reqs_padded):\n"
                    "    if idx_mapping.numel() > 3:\n        os.kill(os.getpid(), signal.SIGSEGV)\n")
    code, out = cli("fuzz", "--stateless", "--v2-gather", f"{path}:gather", "--device", "cpu", "--examples", "40",
                    "--seed", "2", "--out", str(tmp_path / "cases"))
    assert code == 1, out
    assert "v2-gather kernel was killed by signal SIGSEGV during stateless call" in out
    assert f"blocktable fuzz --stateless --seed 2 --v2-gather {path}:gather" in out
