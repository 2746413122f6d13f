"""Case files (properties/case.py): every program the lockstep machine generates
passes the schema that `replay` checks before it runs anything, so the check refuses
only hand-edited or truncated files; and a case survives the round trip through
JSON, whole run included."""

from __future__ import annotations

import json

import pytest
from hypothesis.stateful import run_state_machine_as_test

from blocktable.properties.cases.case import Case, CaseError, load
from blocktable.properties.lockstep.machine import make_machine
from blocktable.properties.run import profiles
from blocktable.properties.run.prepare import plugins_for

pytestmark = pytest.mark.fuzz


def test_every_generated_program_passes_the_schema(backend, tmp_path):
    runs = []
    machine = make_machine(plugins_for("reference", {}, backend), backend, on_run=runs.append)
    run_state_machine_as_test(machine, settings=profiles.machine_settings(max_examples=25))
    assert len(runs) >= 10
    ops = set()
    whole = {"contract_examples": 3, "programs": [{"world": r.world.to_json(), "program": r.program} for r in runs],
             "dropped": 0}
    for run in runs:
        ops.update(step["op"] for step in run.program)
        case = Case("lockstep", "reference", {"what": "w", "message": "m", "step": len(run.program) - 1},
                    world=run.world, program=list(run.program), whole_run=whole)
        path = case.save(tmp_path)
        again = load(path)
        assert again.program == run.program and again.world == run.world and again.whole_run == json.loads(json.dumps(whole))
    assert {"add", "step"} <= ops


def test_a_whole_run_with_an_unknown_step_is_refused(tmp_path):
    from blocktable.properties.world import WorldConfig

    whole = {"contract_examples": 1, "programs": [{"world": WorldConfig().to_json(),
                                                    "program": [{"op": "add"}, {"op": "teleport"}]}], "dropped": 0}
    data = Case("lockstep", "reference", {"what": "w", "message": "m", "step": 0}, world=WorldConfig(),
                program=[{"op": "add"}], whole_run=whole).to_json()
    path = tmp_path / "case.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CaseError, match="whole_run program 1 step 2: unknown operation 'teleport'"):
        load(path)


def test_a_prefix_worlds_fields_are_written_only_when_set_and_checked(tmp_path):
    from blocktable.properties.world import WorldConfig

    plain = WorldConfig(prefix_caching=True)
    assert "vocabulary" not in plain.to_json() and "fresh_admission" not in plain.to_json()  # as files were
    world = WorldConfig(prefix_caching=True, fresh_admission=True, vocabulary=(7, 8, 2**31 - 2, 0))
    assert WorldConfig.from_json(json.loads(json.dumps(world.to_json()))) == world
    for bad, said in [(dict(vocabulary=(1, 1, 2, 3)), "distinct token ids"),
                      (dict(vocabulary=(1, 2, 3, 2**31 - 1)), r"\[0, 2\*\*31 - 1\)"),
                      (dict(prefix_caching=False, fresh_admission=True), "belong to worlds that cache prefixes")]:
        with pytest.raises(ValueError, match=said):
            WorldConfig(**{"prefix_caching": True, **bad})
    case = Case("lockstep", "reference", {"what": "w", "message": "m", "step": 0}, world=world,
                program=[{"op": "add", "prompt": [0, 3, 4]}])
    with pytest.raises(CaseError, match=r"program step 1: add prompt=\[0, 3, 4\]: the world's vocabulary has "
                                        r"symbols 0 to 3"):
        load(case.save(tmp_path))


def test_a_worlds_free_order_and_a_cases_classes_round_trip(tmp_path):
    from blocktable.properties.world import WorldConfig

    assert "free_order" not in WorldConfig().to_json()  # the default: files written before read the same
    world = WorldConfig(free_order="vllm")
    assert WorldConfig.from_json(json.loads(json.dumps(world.to_json()))) == world
    with pytest.raises(ValueError, match="free_order must be tail or vllm"):
        WorldConfig(free_order="head")
    pool = tmp_path / "pools" / "mine.py"
    case = Case("lockstep", "reference", {"what": "w", "message": "m", "step": 0}, world=world,
                program=[{"op": "add"}], classes={"pool": f"{pool}:MyPool"})
    path = case.save(tmp_path / "cases")
    assert json.loads(path.read_text())["classes"] == {"pool": "../pools/mine.py:MyPool"}
    assert load(path).classes == {"pool": f"{pool}:MyPool"} and path.name.startswith("case-mine-MyPool-")
    data = json.loads(path.read_text())
    data["classes"] = {"scheduler": "x.py:S"}  # not a class kind of §11
    path.write_text(json.dumps(data))
    with pytest.raises(CaseError, match="'classes' must be an object naming a class plug-in for each of "
                                        "table, table-v2, pool"):
        load(path)
