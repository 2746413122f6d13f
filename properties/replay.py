"""Re-running a case deterministically, and running one stateless slot-mapping
call (a contract example, a stateless-fuzz case) through a kernel behind guards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from blocktable.device import Backend
from blocktable.plugin import SlotMappingFn
from blocktable.properties import fault
from blocktable.properties.case import Case
from blocktable.properties.compare import Discrepancy, check_slot_mapping
from blocktable.properties.guard import GuardedCall
from blocktable.properties.lockstep import Lockstep
from blocktable.reference import slot_mapping as reference_slot_mapping


@dataclass
class Outcome:
    passed: bool
    error: BaseException | None = None
    failed_step: int | None = None  # index into the program; None: during set-up or a stateless call
    run: Lockstep | None = None


def replay_lockstep(case: Case, kernel: SlotMappingFn, backend: Backend,
                    on_step: Callable[[int, dict[str, Any]], None] | None = None) -> Outcome:
    assert case.world is not None
    try:
        run = Lockstep(case.world, kernel, backend)
    except Exception as e:  # the implementation refused a valid configuration
        return Outcome(False, e, None, None)
    for i, step in enumerate(case.program):
        if on_step is not None:
            on_step(i, step)
        try:
            run.apply(step)
        except Exception as e:
            return Outcome(False, e, i, run)
    return Outcome(True, run=run)


def slot_call(name: str, config: dict[str, int], qsl: np.ndarray, positions: np.ndarray, table: np.ndarray,
              max_num_tokens: int) -> dict[str, Any]:
    """A stateless call as case-file data."""
    return {"name": name, "config": dict(config), "query_start_loc": qsl.tolist(), "positions": positions.tolist(),
            "block_table": table.tolist(), "width": int(table.shape[1]), "max_num_tokens": int(max_num_tokens)}


def run_slot_call(call: dict[str, Any], kernel: SlotMappingFn, backend: Backend) -> Outcome:
    qsl = np.array(call["query_start_loc"], dtype=np.int32)
    positions = np.array(call["positions"], dtype=np.int64)
    table = np.array(call["block_table"], dtype=np.int32).reshape(-1, call["width"])
    tmax = call["max_num_tokens"]
    config = call["config"]
    expected = reference_slot_mapping(qsl, positions, table, tmax, **config)
    device = backend.device
    guarded = GuardedCall(table.shape[0], table.shape[1], len(qsl) - 1, len(positions), tmax, device)
    args = (guarded.qsl.load(torch.from_numpy(qsl).to(device)),
            guarded.positions.load(torch.from_numpy(positions).to(device)),
            guarded.table.load(torch.from_numpy(table).to(device)),
            guarded.output())
    try:
        kernel(*args, **config)
        guarded.check()
        check_slot_mapping(f"{call['name']} slot mapping", expected, args[3].cpu().numpy(), group=0,
                           rank=config.get("cp_rank", 0), config=config, query_start_loc=qsl, positions=positions,
                           table=table, requests=list(range(len(qsl) - 1)))
    except Discrepancy as e:
        return Outcome(False, e)
    except Exception as e:
        fault.check(e)
        return Outcome(False, _raised(call, e))
    return Outcome(True)


def _raised(call: dict[str, Any], error: Exception) -> Discrepancy:
    """The kernel's exception as a discrepancy that keeps it as its cause, so that the
    report can show where in the plug-in's code it was raised."""
    discrepancy = Discrepancy(f"{call['name']} slot mapping", f"the kernel raised {type(error).__name__}: {error}")
    discrepancy.__cause__ = error
    return discrepancy


def replay_whole_run(whole: dict[str, Any], spec: str, kernel: SlotMappingFn, backend: Backend,
                     on_program: Callable[[Case], None] | None = None,
                     on_step: Callable[[int, dict[str, Any]], None] | None = None) -> tuple[Outcome, Case | None, str]:
    """Replay a case's whole run (properties/case.py) in order, as the fuzzing process
    ran it: the contract examples, then every program. (the outcome, the part that
    failed as a case, which part that was); the first failure ends it."""
    from blocktable.properties.examples import SPEC_EXAMPLES
    from blocktable.properties.world import WorldConfig

    for example in SPEC_EXAMPLES[:whole["contract_examples"]]:
        qsl, positions, table = example.inputs()
        call = slot_call(example.name, example.kwargs(), qsl, positions, table, example.tmax)
        part = Case("slot-call", spec, {}, call=call)
        if on_program is not None:
            on_program(part)
        outcome = run_slot_call(call, kernel, backend)
        if not outcome.passed:
            return outcome, part, f"contract example {example.name}"
    programs = whole["programs"]
    for i, entry in enumerate(programs):
        part = Case("lockstep", spec, {}, world=WorldConfig.from_json(entry["world"]), program=list(entry["program"]))
        if on_program is not None:
            on_program(part)
        outcome = replay_lockstep(part, kernel, backend, on_step=on_step)
        if not outcome.passed:
            return outcome, part, f"program {i + 1} of {len(programs)}"
    return Outcome(True), None, ""
