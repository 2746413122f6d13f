"""Reports a user can act on: a failure is replayed in a fresh process before its
case file is written, and a kernel that keeps state from call to call is named as
such; `replay --repeat` counts failures over fresh processes; a plug-in's exception
shows its own file and line; a clean run leaves nothing behind; the poured-in
poison is labelled; case files of different kernels never overwrite one another."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from blocktable.properties.cases.case import Case, load
from blocktable.properties.slot.examples import SPEC_EXAMPLES

pytestmark = pytest.mark.fuzz

GOOD = Path(__file__).resolve().parents[2] / "examples" / "numpy_slot_mapping.py"


def plugin(path: Path, body: str) -> Path:
    """The correct example plug-in behind `body`, which ends calling `good`."""
    path.write_text(f'''import importlib.util
import os

spec = importlib.util.spec_from_file_location("good", {str(GOOD)!r})
good = importlib.util.module_from_spec(spec)
spec.loader.exec_module(good)
{body}''')
    return path


# A cache keyed on the output and input sizes only: a later call of the same sizes
# gets an earlier call's slots. Fails only after an earlier call filled the cache.
CACHED = '''
CACHE = {}


def slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw):
    key = (slot_mapping.numel(), positions.numel())  # the table is not in the key
    if key not in CACHE:
        good.slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw)
        CACHE[key] = slot_mapping.clone()
    slot_mapping.copy_(CACHE[key])
'''

# A table kept by the output's address: a later call whose output lands where an
# earlier one's was gets that call's slots (vLLM-style metadata caches keyed by
# data_ptr). Which addresses come back differs from one process to the next.
BY_DATA_PTR = '''
TABLE = {}


def slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw):
    kept = TABLE.get(slot_mapping.data_ptr())
    if kept is not None and kept.numel() >= slot_mapping.numel():
        slot_mapping.copy_(kept[:slot_mapping.numel()])
        return
    good.slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw)
    TABLE[slot_mapping.data_ptr()] = slot_mapping.clone()
'''

# Every third call, counted across processes in a file: the first slot is wrong.
ONE_IN_THREE = '''

def slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw):
    good.slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw)
    counter = os.environ["CALL_COUNTER"]
    calls = int(open(counter).read() or 0) + 1 if os.path.exists(counter) else 1
    open(counter, "w").write(str(calls))
    if calls % 3 == 0:
        slot_mapping[0] += 1
'''

# Raises from a helper, two calls deep in the plug-in's own file, on a contract example.
RAISES = '''

def check_rows(rows):
    if rows > 2:
        raise IndexError(f"{rows} rows is more than I handle")


def slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw):
    good.slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw)
    check_rows(query_start_loc.numel())
'''


def case_path(out: str) -> Path:
    return Path(out.split("case file: ")[1].split()[0])


def test_a_plugin_with_state_across_calls_says_it_did_not_repeat_in_a_fresh_process(cli, tmp_path):
    kernel = plugin(tmp_path / "cached.py", CACHED)
    code, out = cli("fuzz", "--kernel", f"{kernel}:slot_mapping", "--examples", "20", "--device", "cpu")
    assert code == 1, out
    assert "blocktable found a discrepancy that did not repeat in a fresh process" in out
    assert "not confirmed: replayed alone in a fresh process, it passes." in out
    assert "fails again in a fresh process: the kernel keeps state from earlier calls" in out
    path = case_path(out)
    data = json.loads(path.read_text())
    assert data["version"] == 2
    assert data["confirmation"]["reproduced"] is False and data["confirmation"]["whole_run_reproduced"] is True
    assert data["whole_run"]["contract_examples"] >= 2  # the call that filled the cache came before
    # The case alone passes in a fresh process; replay then replays the whole run, which fails.
    code, replayed = cli("replay", str(path), "--device", "cpu")
    assert code == 1, replayed
    assert "the case alone passes in a fresh process" in replayed and "whole run" in replayed
    assert data["failure"]["message"].split(":")[0] in replayed


def test_a_plugin_keeping_a_table_by_data_ptr_is_said_to_keep_state_not_to_be_nondeterministic(cli, tmp_path):
    """Stateless batches each get new buffers; the allocator hands an output the
    address of an earlier one sooner or later, and the kernel returns that call's
    slots. Run again in the same memory it fails again; alone in a fresh process it
    passes: state kept from earlier calls, which is what the report and the case say."""
    kernel = plugin(tmp_path / "by_data_ptr.py", BY_DATA_PTR)
    code, out = cli("fuzz", "--stateless", "--kernel", f"{kernel}:slot_mapping", "--examples", "200",
                    "--device", "cpu")
    assert code == 1, out
    lines = out.splitlines()
    assert "blocktable found a discrepancy that did not repeat in a fresh process" in lines
    assert "  not confirmed: replayed alone in a fresh process, it passes." in lines
    assert ("  it fails again in the process that found it, replayed there after its earlier calls: the kernel keeps "
            "state from earlier calls (a cache keyed on the wrong inputs, a table kept by data_ptr) and this failure "
            "depends on it.") in lines
    assert "nondeterministic" not in out
    data = json.loads(case_path(out).read_text())
    assert data["kind"] == "slot-call" and "whole_run" not in data
    assert data["confirmation"] == {
        "reproduced": False, "whole_run_reproduced": None, "repeated_in_process": True,
        "note": "passes alone in a fresh process, but fails again in the process that found it, replayed there after "
                "its earlier calls: the kernel keeps state from earlier calls (a table kept by data_ptr sees other "
                "addresses in another process) and the failure depends on it"}


def test_a_plugin_that_fails_alone_is_confirmed_and_keeps_no_whole_run(cli, tmp_path):
    kernel = plugin(tmp_path / "raises.py", RAISES)
    code, out = cli("fuzz", "--kernel", f"{kernel}:slot_mapping", "--examples", "5", "--device", "cpu")
    assert code == 1, out
    assert "confirmed: it fails again when replayed alone in a fresh process" in out
    data = json.loads(case_path(out).read_text())
    assert data["confirmation"]["reproduced"] is True and "whole_run" not in data


def test_a_plugins_exception_shows_its_own_file_and_line_in_fuzz_and_replay(cli, tmp_path):
    kernel = plugin(tmp_path / "raises.py", RAISES)
    lines = kernel.read_text().splitlines()
    raise_line = next(i + 1 for i, line in enumerate(lines) if "raise IndexError" in line)
    call_line = next(i + 1 for i, line in enumerate(lines) if "check_rows(query_start_loc" in line)
    code, out = cli("fuzz", "--kernel", f"{kernel}:slot_mapping", "--examples", "5", "--device", "cpu")
    assert code == 1, out
    for text in (out, cli("replay", str(case_path(out)), "--device", "cpu")[1]):
        assert "the kernel raised IndexError" in text
        assert "raised in the plug-in's code (IndexError" in text
        assert f"{kernel}:{call_line} in slot_mapping" in text
        assert f"{kernel}:{raise_line} in check_rows" in text
        assert "slot/call.py" not in text and "replay.py:" not in text  # blocktable's own frames: only with --verbose
    code, verbose = cli("replay", str(case_path(out)), "--device", "cpu", "--verbose")
    assert code == 1
    assert "the whole exception chain:" in verbose and "The above exception was the direct cause" in verbose
    assert "properties/slot/call.py" in verbose  # the contract example ran there


def test_an_import_error_in_a_plugin_names_its_line(cli, tmp_path):
    kernel = tmp_path / "broken.py"
    kernel.write_text("import numpy\n\n\nVALUE = numpy.nothing_here\n")
    code, out = cli("fuzz", "--kernel", f"{kernel}:slot_mapping", "--device", "cpu")
    assert code == 2 and f"(at {kernel}:4)" in out, out


def slot_call_case(tmp_path: Path, kernel: str) -> Path:
    example = SPEC_EXAMPLES[0]
    call = example.call()
    case = Case("slot-call", kernel, {"what": f"{example.name} slot mapping", "message": "seen once", "step": None},
                call=call)
    return case.save(tmp_path / "cases")


def test_replay_repeat_reports_how_often_a_one_in_three_failure_fails(cli, tmp_path, monkeypatch):
    kernel = plugin(tmp_path / "one_in_three.py", ONE_IN_THREE)
    monkeypatch.setenv("CALL_COUNTER", str(tmp_path / "calls"))
    path = slot_call_case(tmp_path, f"{kernel}:slot_mapping")
    code, out = cli("replay", str(path), "--repeat", "3", "--device", "cpu")
    assert code == 1, out
    assert [line for line in out.splitlines() if line.startswith("replay ")] == [
        "replay 1 of 3: passes", "replay 2 of 3: passes", "replay 3 of 3: fails"]
    assert f"{path} failed in 1 of 3 fresh processes (33%; replays 3)" in out
    assert (tmp_path / "calls").read_text() == "3"  # one call per fresh process


def test_replay_repeat_of_a_case_that_always_passes_exits_0(cli, tmp_path):
    path = slot_call_case(tmp_path, "reference")
    code, out = cli("replay", str(path), "--repeat", "2", "--device", "cpu")
    assert code == 0 and "passed in all 2 fresh processes" in out, out


def test_a_clean_run_leaves_no_journal_and_no_folder_behind(cli, tmp_path):
    code, out = cli("fuzz", "--kernel", "reference", "--examples", "2", "--device", "cpu", "--out", "cases")
    assert code == 0, out
    assert not (tmp_path / "cases").exists()
    (tmp_path / "kept").mkdir()  # a folder the user made stays, empty
    code, out = cli("fuzz", "--kernel", "reference", "--examples", "2", "--device", "cpu", "--out", "kept")
    assert code == 0 and list((tmp_path / "kept").iterdir()) == []


def test_the_poured_in_poison_is_labelled_as_never_written():
    from blocktable.properties.report.describe import failure_lines
    from blocktable.properties.report.report import Report, render
    from blocktable.properties.slot.compare import SlotDiscrepancy, check_slot_mapping
    from blocktable.properties.slot.guard import UNWRITTEN

    example = SPEC_EXAMPLES[0]
    qsl, positions, table = example.inputs()
    expected = example.expected_mapping()
    actual = expected.copy()
    actual[1] = UNWRITTEN
    with pytest.raises(SlotDiscrepancy) as raised:
        check_slot_mapping("slots", expected, actual, group=0, rank=0, config=example.kwargs(),
                           query_start_loc=qsl, positions=positions, table=table, requests=[0, 1, 2, 3])
    text = render(Report("title", "k", "d", "c", None, None, failure_lines(raised.value, None, [], False)))
    assert f"got {UNWRITTEN} (never written by the kernel)" in text
    assert f"actual slot {UNWRITTEN} (never written by the kernel)" in text
    assert text.count(str(UNWRITTEN)) == text.count("never written by the kernel")


def test_case_files_of_different_kernels_and_failures_never_share_a_name(tmp_path):
    example = SPEC_EXAMPLES[0]
    call = example.call()
    failure = {"what": "slots", "message": "first at token 0", "step": None}
    kernels = ["/a/kernel.py:slot_mapping", "/b/kernel.py:slot_mapping", "/a/other.py:slot_mapping", "triton"]
    paths = {Case("slot-call", k, dict(failure), call=call).path_in(tmp_path) for k in kernels}
    assert len(paths) == len(kernels)
    assert Case("slot-call", "triton", dict(failure), call=call).path_in(tmp_path).name.startswith("case-triton-")
    assert any(p.name.startswith("case-other-slot-mapping-") for p in paths)
    other = Case("slot-call", "triton", {**failure, "message": "first at token 1"}, call=call).path_in(tmp_path)
    assert other not in paths
    same = Case("slot-call", "triton", dict(failure), call=call).path_in(tmp_path)
    assert same in paths  # the same failure of the same kernel: the same file


def test_version_1_case_files_still_load(tmp_path):
    example = SPEC_EXAMPLES[0]
    _, _, table = example.inputs()
    call = example.call()
    data = Case("slot-call", "triton", {"what": "w", "message": "m", "step": None}, call=call).to_json()
    data["version"] = 1
    del data["confirmation"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    case = load(path)
    assert case.confirmation is None and case.whole_run is None and case.call["name"] == example.name
    assert np.array(case.call["block_table"]).shape == table.shape
