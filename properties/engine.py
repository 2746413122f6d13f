"""`blocktable fuzz` and `blocktable replay`, the work done in the child process.

fuzz: the contract's worked examples first (a kernel that gets those wrong needs no
fuzzing), then the lockstep machines in seeded chunks until the example count or
the time is reached. A failure is shrunk by Hypothesis, confirmed by replaying the
shrunk program from a fresh start, saved as a case file and rendered as a report.
Every step is journaled before it runs (properties/journal.py).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from blocktable import device, plugin
from blocktable.properties import fault, profiles
from blocktable.properties.case import Case, load, provenance
from blocktable.properties.examples import SPEC_EXAMPLES
from blocktable.properties.journal import Journal
from blocktable.properties.reference_kernel import harness_kernels
from blocktable.properties.replay import Outcome, replay_lockstep, run_slot_call, slot_call
from blocktable.properties.report import render

Send = Callable[[dict[str, Any]], None]
# Examples per seeded chunk when fuzzing for a time budget. Each chunk is a fresh
# Hypothesis run (its own seed, its simplest programs first); 400-program chunks
# ran 7-25% more programs or steps a second on a GPU but found several of the
# mutation gate's bugs far later (README, Known limitations), so 40 everywhere.
CHUNK_FOR_TIME = 40


def replay_command(case_path: Path, kernel: str, device_name: str) -> str:
    return f"blocktable replay {case_path} --kernel {kernel} --device {device_name}"


def prepare(payload: dict[str, Any], send: Send) -> tuple[device.Backend, Any] | None:
    """The child's device, profile and kernel; None (a config-error result sent) on failure."""
    fault.exit_on_device_faults()
    try:
        backend = device.select(payload["device"])
    except (RuntimeError, ValueError) as e:
        send({"type": "result", "status": "config-error", "message": str(e)})
        return None
    os.environ[profiles.PROFILE_VARIABLE] = payload.get("profile", "ci")
    profiles.register_and_load()
    profiles.collect_less()
    try:
        kernel = plugin.load(payload["kernel"], harness_kernels())
    except plugin.PluginError as e:
        send({"type": "result", "status": "config-error", "message": str(e)})
        return None
    return backend, kernel


def _device_name(backend: device.Backend) -> str:
    return "cpu" if backend.interpreted else "cuda"


def report_failure(case: Case, outcome: Outcome, backend: device.Backend, case_path: Path,
                   title: str = "blocktable found a discrepancy") -> str:
    config_text = case.world.describe() if case.world else call_text(case.call or {})
    return render(kernel=case.kernel, device=backend.describe(), error=outcome.error, config_text=config_text,
                  program=case.program if case.kind == "lockstep" else None, failed_step=outcome.failed_step,
                  replay_command=replay_command(case_path, case.kernel, _device_name(backend)), run=outcome.run,
                  title=title)


def config_text(name: str, config: dict[str, int], requests: int, tokens: int, max_num_tokens: int) -> str:
    """One slot-mapping call's configuration and size, as reports show it."""
    c = config
    return (f"{name}: K={c.get('kv_block_size')} B={c.get('kernel_block_size')} "
            f"W={c.get('cp_world_size', 1)} R={c.get('cp_rank', 0)} I={c.get('cp_interleave', 1)}, "
            f"{requests} requests, {tokens} tokens, Tmax {max_num_tokens}")


def call_text(call: dict[str, Any]) -> str:
    return config_text(call.get("name", "call"), call.get("config", {}), len(call.get("query_start_loc", [0])) - 1,
                       len(call.get("positions", [])), call.get("max_num_tokens"))


def send_failure(send: Send, case: Case, outcome: Outcome, backend: device.Backend, out: Path,
                 stats: dict[str, Any], title: str = "blocktable found a discrepancy") -> None:
    """Save the case file and send the result message with the rendered report."""
    case.failure = {"what": getattr(outcome.error, "what", type(outcome.error).__name__),
                    "message": str(outcome.error), "step": outcome.failed_step}
    path = case.save(out)
    send({"type": "result", "status": "fail", "case": str(path), "kind": case.kind,
          "program_steps": len(case.program), "report": report_failure(case, outcome, backend, path, title),
          "step": outcome.failed_step, "first": slot_mismatch(outcome.error), "device": backend.describe(),
          **stats})


def fuzz_child(payload: dict[str, Any], send: Send) -> None:
    from hypothesis import seed as hypothesis_seed
    from hypothesis.stateful import run_state_machine_as_test

    from blocktable.properties.machine import LAST_RUN, make_machine

    ready = prepare(payload, send)
    if ready is None:
        return
    backend, kernel = ready
    LAST_RUN.clear()
    out = Path(payload["out"])
    spec = payload["kernel"]
    journal = Journal(Path(payload["journal"]))
    described = backend.describe()  # once: on a GPU it asks the driver
    prov = provenance("interpreter" if backend.interpreted else described, seed=payload["seed"],
                      profile=payload["profile"])
    start = time.monotonic()
    stats: dict[str, Any] = {"examples": 0, "steps": 0, "steps_with_tokens": 0, "operations": 0, "events": Counter()}

    for example in SPEC_EXAMPLES:
        qsl, positions, table = example.inputs()
        call = slot_call(example.name, example.kwargs(), qsl, positions, table, example.tmax)
        journal.start({"kind": "slot-call", "kernel": spec, "call": call, "device": described})
        outcome = run_slot_call(call, kernel, backend)
        if not outcome.passed:
            stats["first_failure"], stats["examples_to_failure"] = time.monotonic(), 0
            send_failure(send, Case("slot-call", spec, {}, call=call, provenance=prov), outcome, backend, out,
                         _public(stats, start))
            return
    send({"type": "progress", "phase": "spec examples passed", **_public(stats, start)})

    last_sent = [0.0]

    def on_run(run: Any) -> None:
        # The run before this one has ended: count it and let it go. Keeping a chunk's
        # runs alive (each with its device caches and histories) cost memory and made
        # every full collection walk them all.
        _account(runs, stats)
        runs.append(run)
        stats["examples"] += 1
        run._ordinal = stats["examples"]
        journal.start({"kind": "lockstep", "kernel": spec, "world": run.world.to_json(), "device": described})
        run.on_step = journal.write
        now = time.monotonic()
        if now - last_sent[0] > 0.25:
            last_sent[0] = now
            send({"type": "progress", "phase": "lockstep", **_public(stats, start)})

    examples = payload.get("examples")
    deadline = start + 60 * payload["minutes"] if payload.get("minutes") else None
    chunk_index = 0
    runs: list[Any] = []  # the run in progress, not yet counted
    while True:
        if deadline is None:
            size = min(examples - stats["examples"], profiles.MACHINE_BUDGET[payload["profile"]][0])
        else:
            size = CHUNK_FOR_TIME
        if size <= 0 or (deadline is not None and time.monotonic() >= deadline):
            break
        machine = make_machine(kernel, backend, on_run=on_run)
        hypothesis_seed(payload["seed"] * 100003 + chunk_index)(machine)
        chunk_index += 1
        try:
            run_state_machine_as_test(machine, settings=profiles.machine_settings(max_examples=size, database=None))
        except BaseException as failure:  # noqa: BLE001 - whatever failed, it failed
            if isinstance(failure, KeyboardInterrupt):
                raise
            _account(runs, stats)
            if stats.get("first_failure") is None and "build_failed_at" in LAST_RUN:
                stats["first_failure"] = LAST_RUN["build_failed_at"]
                stats["examples_to_failure"] = stats["examples"] + 1
            last = LAST_RUN.get("run")
            world = last.world if last is not None else LAST_RUN.get("world")
            program = list(last.program) if last is not None else []
            case = Case("lockstep", spec, {}, world=world, program=program, provenance=prov)
            journal.close()
            outcome = replay_lockstep(case, kernel, backend)
            title = "blocktable found a discrepancy"
            if outcome.passed:
                outcome = Outcome(False, failure, len(program) - 1 if program else None, last)
                title = "blocktable found a failure that did not repeat on replay (flaky or order-dependent)"
            send_failure(send, case, outcome, backend, out, _public(stats, start), title)
            return
        _account(runs, stats)
    journal.close()
    send({"type": "result", "status": "pass", "device": backend.describe(), **_public(stats, start)})


def _account(runs: list[Any], stats: dict[str, Any]) -> None:
    """Fold finished runs into the totals and let them go: emptying the list is what
    keeps a run from being counted twice."""
    for run in runs:
        if run.failed_at is not None and stats.get("first_failure") is None:
            stats["first_failure"] = run.failed_at
            stats["examples_to_failure"] = getattr(run, "_ordinal", None)
        stats["steps"] += run.steps_checked
        stats["steps_with_tokens"] += run.steps_with_tokens
        stats["operations"] += len(run.program)
        stats["events"].update(run.events)
    runs.clear()


def _public(stats: dict[str, Any], start: float) -> dict[str, Any]:
    first = stats.get("first_failure")
    return {"examples": stats["examples"], "steps": stats["steps"], "steps_with_tokens": stats["steps_with_tokens"],
            "operations": stats["operations"],
            "events": dict(stats["events"]), "elapsed": time.monotonic() - start,
            "first_failure_s": None if first is None else first - start,
            "examples_to_failure": stats.get("examples_to_failure")}


def replay_child(payload: dict[str, Any], send: Send) -> None:
    """Replay one case file; result status "pass" or "fail" with the report."""
    ready = prepare(payload, send)
    if ready is None:
        return
    backend, kernel = ready
    case_path = Path(payload["case"])
    case = load(case_path)
    case.kernel = payload["kernel"]
    verbose = payload.get("verbose", False)

    def show(i: int, step: dict[str, Any]) -> None:
        if verbose:
            from blocktable.properties.report import describe_step

            send({"type": "log", "text": f"step {i + 1}: {describe_step(step)}"})

    if payload.get("journal"):
        journal = Journal(Path(payload["journal"]))
        journal.start({"kind": case.kind, "kernel": case.kernel, "device": backend.describe(),
                       "world": case.world.to_json() if case.world else None, "call": case.call})
    else:
        journal = None
    if case.kind == "slot-call":
        outcome = run_slot_call(case.call or {}, kernel, backend)
    else:
        def step_hook(i: int, step: dict[str, Any]) -> None:
            show(i, step)
            if journal is not None:
                journal.write(step)
        outcome = replay_lockstep(case, kernel, backend, on_step=step_hook)
    if journal is not None:
        journal.close()
    if outcome.passed:
        send({"type": "result", "status": "pass", "device": backend.describe()})
        return
    first = slot_mismatch(outcome.error)
    send({"type": "result", "status": "fail", "report": report_failure(case, outcome, backend, case_path),
          "device": backend.describe(), "what": getattr(outcome.error, "what", type(outcome.error).__name__),
          "step": outcome.failed_step, "first": first})


def slot_mismatch(error: BaseException | None) -> list[int] | None:
    """(token, expected, actual) of a slot discrepancy's first difference, for triage."""
    from blocktable.properties.compare import SlotDiscrepancy

    if isinstance(error, SlotDiscrepancy):
        import numpy as np

        differ = np.flatnonzero(error.expected_mapping != error.actual_mapping)
        if len(differ):
            t = int(differ[0])
            return [t, int(error.expected_mapping[t]), int(error.actual_mapping[t])]
    return None
