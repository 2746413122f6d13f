"""A plug-in that resizes its output (issue 31, item 8) is the plug-in's finding,
named as such, in the lockstep and alone (`--stateless`): a failure with a case file
and a replay line that fails again, not a harness traceback reported as a dead
process, and not a pass."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fuzz

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def plugin(path: Path, example: str, signature: str, call: str, resize: str) -> str:
    """The example plug-in `example`, then `resize`; the spec of the function."""
    name = signature.split("(")[0]
    path.write_text(f'''import importlib.util

spec = importlib.util.spec_from_file_location("good", {str(EXAMPLES / example)!r})
good = importlib.util.module_from_spec(spec)
spec.loader.exec_module(good)


def {signature}:
    good.{call}
    {resize}
''')
    return f"{path}:{name}"


def run(cli, tmp_path: Path, *flags: str, examples: int = 20) -> tuple[dict, str, list[str]]:
    """Fuzz with `flags` (up to `examples` programs; a run stops at its first failure):
    the case file's data, the report's failure line, the output lines."""
    code, out = cli("fuzz", *flags, "--device", "cpu", "--examples", str(examples), "--out", str(tmp_path / "cases"))
    assert code == 1, out
    assert "exited with status" not in out and "Traceback" not in out, out
    lines = out.splitlines()
    assert "blocktable found a discrepancy" in lines
    assert "  confirmed: it fails again when replayed alone in a fresh process" in lines
    assert len([line for line in lines if line.startswith("replay: blocktable replay ")]) == 1
    case = Path(out.split("case file: ")[1].split()[0])
    failure = next(line for line in lines if line.startswith("  failure"))
    return json.loads(case.read_text()), failure, [str(case)]


def replays(cli, case: list[str], failure: str) -> None:
    code, out = cli("replay", *case)
    assert code == 1, out
    assert failure in out.splitlines()


# A slot-mapping plug-in that shrinks its output to two slots on a table of five rows
# or more: no contract example has one, so the lockstep's programs (and the stateless
# batches) are what find it.
SLOT = ("numpy_slot_mapping.py", "slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw)",
        "slot_mapping(query_start_loc, positions, block_table, slot_mapping, **kw)",
        "if block_table.shape[0] >= 5:\n        slot_mapping.resize_(2)")


def test_a_slot_mapping_plugin_that_resizes_its_output_in_the_lockstep(cli, tmp_path):
    spec = plugin(tmp_path / "resizes.py", *SLOT)
    data, failure, case = run(cli, tmp_path, "--kernel", spec)
    assert data["kind"] == "lockstep"
    tmax, step = data["world"]["max_num_batched_tokens"], data["failure"]["step"]
    message = f"the kernel changed the shape of its output slot_mapping from ({tmax},) to (2,)"
    assert data["failure"]["message"] == f"group 0 rank 0 slot mapping: {message}"
    assert failure == f"  failure at step {step + 1}: Discrepancy: group 0 rank 0 slot mapping: {message}"
    replays(cli, case, failure)


def test_a_slot_mapping_plugin_that_resizes_its_output_alone(cli, tmp_path):
    spec = plugin(tmp_path / "resizes.py", *SLOT)
    data, failure, case = run(cli, tmp_path, "--stateless", "--kernel", spec)
    assert data["kind"] == "slot-call"
    call = data["call"]
    assert failure == (f"  failure: Discrepancy: {call['name']} slot mapping: the kernel changed the shape of its "
                       f"output slot_mapping from ({call['max_num_tokens']},) to (2,)")
    replays(cli, case, failure)


GATHER = ("torch_kv_gather.py",
          "gather(key_cache, value_cache, block_table, cu_lens, out_key, out_value, **kw)",
          "gather(key_cache, value_cache, block_table, cu_lens, out_key, out_value, **kw)",
          "out_key.resize_(1)")


def test_a_kv_gather_plugin_that_resizes_out_key_in_the_lockstep(cli, tmp_path):
    spec = plugin(tmp_path / "resizes.py", *GATHER)
    data, failure, case = run(cli, tmp_path, "--kv-gather", spec)
    assert data["kind"] == "lockstep" and data["kv"] == {"gather": "../resizes.py:gather"}
    kv, step = data["world"]["kv"], data["failure"]["step"]
    # The output's rows: every gathered position, then three padding rows.
    found = re.fullmatch(rf"  failure at step {step + 1}: Discrepancy: group 0 kv-gather: the kv-gather kernel "
                         rf"changed the shape of its output out_key from \((\d+), {kv['num_heads']}, "
                         rf"{kv['head_size']}\) to \(1,\)", failure)
    assert found is not None, failure
    assert int(found.group(1)) >= 3
    replays(cli, case, failure)


def test_a_kv_gather_plugin_that_resizes_out_key_alone(cli, tmp_path):
    spec = plugin(tmp_path / "resizes.py", *GATHER)
    data, failure, case = run(cli, tmp_path, "--stateless", "--kv-gather", spec)
    call = data["call"]
    assert data["kind"] == "kv-call" and call["op"] == "gather"
    assert failure == (f"  failure: Discrepancy: {call['name']} kv-gather: the kv-gather kernel changed the shape "
                       f"of its output out_key from ({call['out_rows']}, {call['num_heads']}, {call['head_size']}) "
                       f"to (1,)")
    replays(cli, case, failure)


SLOTS = ("torch_v2_slots.py", "slots(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **kw)",
         "slot_mappings(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **kw)",
         "slots.resize_(1)")


def test_a_v2_slots_plugin_that_resizes_its_output_in_the_lockstep(cli, tmp_path):
    spec = plugin(tmp_path / "resizes.py", *SLOTS)
    data, failure, case = run(cli, tmp_path, "--v2-slots", spec, examples=200)  # one world in four keeps V2 tables
    world, step = data["world"], data["failure"]["step"]
    assert data["kind"] == "lockstep" and data["v2"] == {"slots": "../resizes.py:slots"}
    groups, tmax = len(world["groups"]), world["max_num_batched_tokens"]
    rank = "rank 0 " if world.get("cp_world_size", 1) > 1 else ""  # under DCP, the first rank's call
    assert failure == (f"  failure at step {step + 1}: Discrepancy: {rank}V2 slots: the v2-slots kernel changed the "
                       f"shape of its output slots from ({groups}, {tmax}) to (1,)")
    replays(cli, case, failure)


def test_a_v2_slots_plugin_that_resizes_its_output_alone(cli, tmp_path):
    spec = plugin(tmp_path / "resizes.py", *SLOTS)
    data, failure, case = run(cli, tmp_path, "--stateless", "--v2-slots", spec)
    call = data["call"]
    assert data["kind"] == "v2-call" and call["op"] == "slots"
    groups, tmax = len(call["config"]["block_sizes"]), call["config"]["max_num_batched_tokens"]
    assert failure == (f"  failure: Discrepancy: {call['name']} v2-slots: the v2-slots kernel changed the shape of "
                       f"its output slots from ({groups}, {tmax}) to (1,)")
    replays(cli, case, failure)
