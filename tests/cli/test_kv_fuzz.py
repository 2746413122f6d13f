"""`blocktable fuzz --stateless --kv-*` against the example KV plug-ins
(examples/torch_kv_*.py): each passes as written; one planted bug in each is found,
shrunk to one token, pair or request, reported with the element decoded, saved as a
"kv-call" case, and replayed (exit 1 while the bug is there, 0 once it is fixed)."""

import json
import shutil
from pathlib import Path

import pytest

from blocktable.properties.cases.case import load

pytestmark = pytest.mark.fuzz

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KINDS = {"write": ("torch_kv_write.py", "write"), "copy": ("torch_kv_copy.py", "copy_blocks"),
         "gather": ("torch_kv_gather.py", "gather")}
# (kind, the edits planted, what the shrunk case holds, what the report says)
PLANTED = {
    "slot 0 never written": ("write", [("slot_mapping >= 0", "slot_mapping >= 1")],
                             lambda call: call["slot_mapping"] == [0], "(slot 0; token 0)"),
    "NaN turned into a number": ("write", [(".clamp(-448, 448)", ".nan_to_num(0.0).clamp(-448, 448)")],
                                 lambda call: len(call["slot_mapping"]) == 1, "= nan"),
    "last pair skipped": ("copy", [("src, dst = block_mapping[:, 0], block_mapping[:, 1]",
                                    "src, dst = block_mapping[:-1, 0], block_mapping[:-1, 1]")],
                          lambda call: len(call["block_mapping"]) == 1, "becomes a copy of block"),
    "one row past the length": ("gather", [("j = torch.arange(starts[r + 1] - starts[r], ",
                                            "j = torch.arange(starts[r + 1] - starts[r] + 1, "),
                                           ("out[starts[r]:starts[r + 1]] = entries",
                                            "out[starts[r]:starts[r + 1] + 1] = entries")],
                                lambda call: len(call["cu_lens"]) == 2, "past cu_lens[N]"),
}


def plant(tmp_path, kind, edits=()):
    name, function = KINDS[kind]
    source = (EXAMPLES / name).read_text()
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    path = tmp_path / name
    path.write_text(source)
    return f"{path}:{function}"


@pytest.mark.parametrize("kind", KINDS)
def test_each_example_passes_20_calls(cli, tmp_path, kind):
    spec = plant(tmp_path, kind)
    code, out = cli("fuzz", "--stateless", f"--kv-{kind}", spec, "--device", "cpu", "--examples", "20")
    assert code == 0, out
    assert "no discrepancy found" in out and f"kv-{kind} {spec}" in out and "20 / " in out


@pytest.mark.parametrize("kind", ["write", "gather"])
def test_strict_nan_holds_torchs_nan_encodings_exact_and_says_so(cli, tmp_path, kind):
    """The examples cast and decode with torch, whose NaNs are encoded unlike the
    reference's (test_each_example_passes_20_calls: allowed). Under --strict-nan the
    encodings count, the report says that is all that differs, and the case keeps it."""
    spec = plant(tmp_path, kind)
    code, out = cli("fuzz", "--stateless", f"--kv-{kind}", spec, "--device", "cpu", "--examples", "20",
                    "--strict-nan")
    assert code == 1, out
    assert "the difference is only a NaN encoding" in out, out
    case = Path(out.split("case file: ")[1].split()[0])
    assert json.loads(case.read_text())["strict_nan"] is True
    code, replayed = cli("replay", str(case))
    assert code == 1 and "the difference is only a NaN encoding" in replayed


@pytest.mark.parametrize("bug", PLANTED)
def test_a_planted_bug_is_found_shrunk_and_replays(cli, tmp_path, bug):
    kind, edits, shrunk, said = PLANTED[bug]
    spec = plant(tmp_path, kind, edits)
    code, out = cli("fuzz", "--stateless", f"--kv-{kind}", spec, "--device", "cpu", "--examples", "20")
    assert code == 1, out
    assert "blocktable found a discrepancy" in out and said in out, out
    assert "confirmed: it fails again when replayed alone in a fresh process" in out
    case = Path(out.split("case file: ")[1].split()[0])
    data = json.loads(case.read_text())
    assert data["kind"] == "kv-call" and load(case).kernel == spec and data["call"]["op"] == kind
    assert data["kernel"] == f"../{KINDS[kind][0]}:{KINDS[kind][1]}"  # relative to the case file
    assert shrunk(data["call"]), data["call"]
    code, replayed = cli("replay", str(case))
    assert code == 1 and said in replayed
    shutil.copyfile(EXAMPLES / KINDS[kind][0], spec.rpartition(":")[0])  # the fix
    code, replayed = cli("replay", str(case))
    assert code == 0, replayed


def test_an_emitted_kv_test_fails_on_the_bug_and_passes_on_the_fix(cli, tmp_path):
    import subprocess
    import sys

    kind, edits, _, _ = PLANTED["slot 0 never written"]
    spec = plant(tmp_path, kind, edits)
    code, out = cli("fuzz", "--stateless", "--kv-write", spec, "--device", "cpu", "--examples", "20")
    case = out.split("case file: ")[1].split()[0]
    code, out = cli("replay", case, "--emit-test", str(tmp_path / "regress"))
    assert code == 1, out

    def pytest_exit() -> int:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "regress")]
        return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path).returncode

    assert pytest_exit() == 1
    shutil.copyfile(EXAMPLES / KINDS[kind][0], spec.rpartition(":")[0])
    assert pytest_exit() == 0


def test_a_crash_in_a_stateless_kv_call_says_which_and_how_to_repeat_it(cli, tmp_path):
    path = tmp_path / "dies.py"
    path.write_text("import os\nimport signal\n\n\ndef copy_blocks(key_caches, value_caches, block_mapping):\n"
                    "    if block_mapping.shape[0] > 3:\n        os.kill(os.getpid(), signal.SIGSEGV)\n")
    code, out = cli("fuzz", "--stateless", "--kv-copy", f"{path}:copy_blocks", "--device", "cpu", "--examples", "40",
                    "--seed", "2", "--out", str(tmp_path / "cases"))
    assert code == 1, out
    assert "kv-copy kernel was killed by signal SIGSEGV during stateless call" in out
    assert f"blocktable fuzz --stateless --seed 2 --kv-copy {path}:copy_blocks" in out


def test_a_kv_plug_in_bug_found_by_the_lockstep_replays_with_the_plug_in(cli, tmp_path):
    """Without --stateless the plug-in runs in the lockstep's KV worlds; the case file
    records it (`kv`), so the fresh-process confirmation and `replay` load it again."""
    spec = plant(tmp_path, "gather", [("j % block_size", "(j + 1) % block_size")])
    code, out = cli("fuzz", "--kv-gather", spec, "--device", "cpu", "--examples", "60", "--seed", "0")
    assert code == 1, out
    assert "KV gather: key row" in out and "local index" in out, out
    assert "confirmed: it fails again when replayed alone in a fresh process" in out
    case = Path(out.split("case file: ")[1].split()[0])
    data = json.loads(case.read_text())
    assert data["kind"] == "lockstep" and load(case).kv == {"gather": spec} and data["world"]["kv"]
    code, replayed = cli("replay", str(case))
    assert code == 1 and "KV gather" in replayed
    shutil.copyfile(EXAMPLES / "torch_kv_gather.py", spec.rpartition(":")[0])  # the fix
    code, replayed = cli("replay", str(case))
    assert code == 0, replayed
