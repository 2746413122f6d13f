"""A KV plug-in's bug found by the lockstep can be pointed at a fix: the case is
named after the KV plug-in, stores it relative to the case file, prints a replay
line that names it, replays with `--kv-gather FIX` from another folder, and its
emitted test runs the plug-in next to it after the whole folder moves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from blocktable.properties.cases.case import Case, family_flags, load

pytestmark = pytest.mark.fuzz

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_kv_gather.py"
BUG = ("j % block_size", "(j + 1) % block_size")


def test_a_kv_lockstep_case_replays_against_a_fix_in_another_folder_and_after_a_move(cli, tmp_path):
    work = tmp_path / "work"
    (work / "plugins").mkdir(parents=True)
    buggy = work / "plugins" / "gather.py"
    buggy.write_text(EXAMPLE.read_text().replace(*BUG))
    spec = f"{buggy}:gather"
    code, out = cli("fuzz", "--kv-gather", spec, "--device", "cpu", "--examples", "60", "--seed", "0",
                    "--out", str(work / "cases"))
    assert code == 1, out
    case_path = Path(out.split("case file: ")[1].split()[0])
    assert case_path.name.startswith("case-gather-gather-"), case_path  # the KV plug-in's name, not triton's
    data = json.loads(case_path.read_text())
    assert data["kernel"] == "triton" and data["kv"] == {"gather": "../plugins/gather.py:gather"}
    line = next(line for line in out.splitlines() if line.startswith("replay: blocktable replay "))
    assert line == f"replay: blocktable replay {case_path} --kernel triton --kv-gather {spec} --device cpu", line

    fixes = tmp_path / "fixes"
    fixes.mkdir()
    shutil.copyfile(EXAMPLE, fixes / "gather.py")
    fix = f"{fixes / 'gather.py'}:gather"
    code, replayed = cli("replay", str(case_path), "--kv-gather", fix, "--device", "cpu")
    assert code == 0 and f"passes now with triton; kv-gather {fix} on" in replayed, replayed
    code, replayed = cli("replay", str(case_path), "--device", "cpu")
    assert code == 1 and "KV gather" in replayed, replayed

    code, out = cli("replay", str(case_path), "--emit-test", str(work / "cases" / "regress"), "--device", "cpu")
    assert code == 1, out
    emitted = json.loads((work / "cases" / "regress" / case_path.name).read_text())
    assert emitted["kv"] == {"gather": "../../plugins/gather.py:gather"}
    moved = tmp_path / "moved"
    work.rename(moved)  # the original paths are gone

    def pytest_exit(**env: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(moved / "cases" / "regress")]
        return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env={**os.environ, **env})

    before = pytest_exit()
    assert before.returncode == 1 and "KV gather" in before.stdout, before.stdout
    assert pytest_exit(BLOCKTABLE_KV_GATHER=fix).returncode == 0
    shutil.copyfile(EXAMPLE, moved / "plugins" / "gather.py")  # the fix, in place
    after = pytest_exit()
    assert after.returncode == 0, after.stdout


def test_plugin_paths_are_stored_relative_to_the_case_file_and_read_back_from_it(tmp_path):
    plugin = tmp_path / "src" / "k.py"
    case = Case("kv-call", f"{plugin}:gather", {"what": "x", "message": "y", "step": None}, kv={})
    lockstep = Case("lockstep", f"{plugin}:slot_mapping", {}, kv={"write": f"{plugin}:write", "copy": "torch"})
    data = lockstep.to_json(tmp_path / "cases")
    assert data["kernel"] == "../src/k.py:slot_mapping" and data["kv"] == {"write": "../src/k.py:write",
                                                                             "copy": "torch"}
    assert family_flags(lockstep) == [f"--kv-write {plugin}:write", "--kv-copy torch"]
    assert case.to_json(tmp_path)["kernel"] == "src/k.py:gather"
    assert lockstep.to_json()["kv"]["write"] == f"{plugin}:write"  # not written yet: as it is


@pytest.mark.parametrize("flags, said", [
    (["--kv-write", "torch"], "the case is one kv-gather call: --kv-write names a kernel it never calls"),
    (["--v2-slots", "torch"], "the case is one kv-gather call: --v2-slots names a kernel it never calls"),
    (["--kernel", "torch", "--kv-gather", "torch"], "--kernel and --kv-gather both name the kv-gather kernel"),
])
def test_replay_refuses_a_kv_flag_a_kv_call_case_has_no_use_for(cli, tmp_path, flags, said):
    import numpy as np

    from blocktable.properties.kv.draw import draw

    call = dict(draw("gather", np.random.default_rng(0), 1 << 12, 50), name="drawn")
    case = Case("kv-call", f"{EXAMPLE}:gather", {"what": "x", "message": "y", "step": None}, call=call)
    path = case.save(tmp_path / "cases")
    assert load(path).call == call
    code, out = cli("replay", str(path), *flags)
    assert code == 2 and said in out and len(out.strip().splitlines()) == 1, out


def test_an_emitted_test_keeps_a_given_fix_relative_to_itself(tmp_path):
    import runpy

    from blocktable.cli.replay import emit_test
    from blocktable.properties.world import WorldConfig

    fix = tmp_path / "fixes" / "gather.py"
    case = Case("lockstep", "triton", {"what": "x", "message": "y", "step": None}, world=WorldConfig(),
                program=[{"op": "add"}], kv={"gather": f"{tmp_path / 'plugins' / 'g.py'}:gather"})
    path = case.save(tmp_path / "cases")
    test = emit_test(path, load(path), tmp_path / "regress", "triton", "cpu", {"kv": {"gather": f"{fix}:gather"}})
    module = runpy.run_path(str(test))
    where, _, function = module["PLUGINS"]["kv"]["gather"].rpartition(":")
    assert list(module["PLUGINS"]) == ["kv"] and Path(where).resolve() == fix.resolve() and function == "gather"
    assert module["VARIABLES"]["kv"] == {"write": "BLOCKTABLE_KV_WRITE", "copy": "BLOCKTABLE_KV_COPY",
                                         "gather": "BLOCKTABLE_KV_GATHER"}
    assert "HERE / '../fixes/gather.py'" in test.read_text()
    assert json.loads((tmp_path / "regress" / path.name).read_text())["kv"] == {"gather": "../plugins/g.py:gather"}


def test_an_emitted_test_names_its_plug_ins_by_normalised_paths(cli, tmp_path):
    """The folder given as `sub/../regress` and plug-ins given as `sub/../plugins/...`:
    the test holds their paths relative to itself, and what it replays (and so every
    report it prints) names them without `..` segments; so does the line saying where
    the test went."""
    import runpy

    from blocktable.properties.world import WorldConfig

    (tmp_path / "sub").mkdir()
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    shutil.copyfile(EXAMPLE.with_name("numpy_slot_mapping.py"), plugins / "slots.py")
    shutil.copyfile(EXAMPLE, plugins / "gather.py")
    case = Case("lockstep", "triton", {"what": "x", "message": "y", "step": None}, world=WorldConfig(),
                program=[{"op": "add"}])
    path = case.save(tmp_path / "cases")
    code, out = cli("replay", str(path), "--kernel", "sub/../plugins/slots.py:slot_mapping", "--kv-gather",
                    "sub/../plugins/gather.py:gather", "--device", "cpu", "--emit-test", "sub/../regress")
    assert code == 0, out  # one add: nothing to fail
    test = tmp_path / "regress" / f"test_{path.stem.replace('-', '_')}.py"
    assert f"wrote regress/{test.name} (and regress/{path.name})" in out.splitlines(), out
    module = runpy.run_path(str(test))
    assert module["KERNEL"] == f"{(plugins / 'slots.py').resolve()}:slot_mapping"
    assert module["PLUGINS"] == {"kv": {"gather": f"{(plugins / 'gather.py').resolve()}:gather"}}
    assert "os.path.normpath(HERE / '../plugins/slots.py')" in test.read_text()
