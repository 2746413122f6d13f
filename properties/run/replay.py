"""Replaying a case deterministically: a lockstep program, a stateless call, or a
case's whole run (the contract examples and every program up to the failing one),
and the child process that `blocktable replay`, the confirmation of a new case and
emitted regression tests run (`replay_child`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blocktable import device, plugin
from blocktable.plugin import Plugins
from blocktable.properties.cases.case import Case, load
from blocktable.properties.kv.call import run_kv_call
from blocktable.properties.lockstep.driver import Lockstep
from blocktable.properties.outcome import Outcome
from blocktable.properties.report.describe import describe_step
from blocktable.properties.run.calls import counted, counting
from blocktable.properties.run.child import Send
from blocktable.properties.run.failure import describe_failure
from blocktable.properties.run.journal import Journal
from blocktable.properties.run.messages import Job, Log, Result
from blocktable.properties.run.prepare import config_error, plugins_for, prepare_backend
from blocktable.properties.slot.call import run_slot_call
from blocktable.properties.slot.examples import SPEC_EXAMPLES
from blocktable.properties.v2.call import run_v2_call
from blocktable.properties.world import WorldConfig

OnStep = Callable[[int, dict[str, Any]], None]


def replay_lockstep(case: Case, kernels: Plugins, backend: device.Backend, on_step: OnStep | None = None) -> Outcome:
    assert case.world is not None
    try:
        run = Lockstep(case.world, kernels, backend)
    except Exception as e:  # the implementation refused a valid configuration
        return Outcome(False, e, None)
    for i, step in enumerate(case.program):
        if on_step is not None:
            on_step(i, step)
        try:
            run.apply(step)
        except Exception as e:
            return Outcome(False, e, i)
    return Outcome(True)


def replay_whole_run(whole: dict[str, Any], kernels: Plugins, backend: device.Backend,
                     on_program: Callable[[Case], None] | None = None,
                     on_step: OnStep | None = None) -> tuple[Outcome, Case | None, str]:
    """Replay a case's whole run (cases/case.py) in order, as the fuzzing process ran
    it: the contract examples, then every program. (the outcome, the part that failed
    as a case, which part that was); the first failure ends it."""
    spec = kernels.slot_spec
    for example in SPEC_EXAMPLES[:whole["contract_examples"]]:
        call = example.call()
        part = Case("slot-call", spec, {}, call=call)
        if on_program is not None:
            on_program(part)
        outcome = run_slot_call(call, kernels.slot, backend)
        if not outcome.passed:
            return outcome, part, f"contract example {example.name}"
    programs = whole["programs"]
    for i, entry in enumerate(programs):
        part = Case("lockstep", spec, {}, world=WorldConfig.from_json(entry["world"]), program=list(entry["program"]))
        if on_program is not None:
            on_program(part)
        outcome = replay_lockstep(part, kernels, backend, on_step=on_step)
        if not outcome.passed:
            return outcome, part, f"program {i + 1} of {len(programs)}"
    return Outcome(True), None, ""


def call_kind_of(job: Job, case_kind: str, kinds: tuple[str, ...]) -> str | None:
    """The op of a `case_kind` case (its kernel is a plug-in of that kind), else None.
    Read before the case is checked: the kernel is loaded first. A file that cannot
    be read is None here and reported when the case is loaded."""
    data = job.case_data
    if data is None and job.case:
        try:
            data = json.loads(Path(job.case).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    if isinstance(data, dict) and data.get("kind") == case_kind and isinstance(data.get("call"), dict):
        op = data["call"].get("op")
        return op if op in kinds else None
    return None


def kv_kind_of(job: Job) -> str | None:
    """The op of a "kv-call" case (its kernel is a KV kernel of that kind), else None."""
    return call_kind_of(job, "kv-call", plugin.KV_KINDS)


def v2_kind_of(job: Job) -> str | None:
    """The op of a "v2-call" case (its kernel is a V2 kernel of that kind), else None."""
    return call_kind_of(job, "v2-call", plugin.V2_KINDS)


def replay_child(job: Job, send: Send) -> None:
    """Replay one case (a file, or its JSON before the file is written); a "pass" or
    "fail" result with the failure. With `job.whole_run`, the case's whole run instead."""
    backend = prepare_backend(job, send)
    if backend is None:
        return
    kind, v2_kind = kv_kind_of(job), v2_kind_of(job)
    try:
        # Counted, so that the parent's watchdog sees a call that does not return (run/calls.py).
        kv_kernel = counted(f"kv-{kind}", plugin.load_kv(kind, job.kernel)) if kind else None
        v2_kernel = counted(f"v2-{v2_kind}", plugin.load_v2(v2_kind, job.kernel)) if v2_kind else None
        kernels = None if kind or v2_kind else counting(plugins_for(job.kernel, job.kv, backend, v2=job.v2,
                                                                    classes=job.classes))
    except plugin.PluginError as e:
        config_error(send, e)
        return
    try:
        if job.case_data is not None:
            case = Case.from_json(job.case_data)
            case_path = Path(job.case or "case.json")
        else:
            case_path = Path(job.case or "")
            case = load(case_path)
    except ValueError as e:  # the parent checks first; a file changed since is still no kernel's fault
        send(Result("config-error", message=str(e)))
        return
    case.kernel = job.kernel
    # The plug-ins the case ran with, each kind the replay names replaced (a fix).
    kv, v2, classes = {**case.kv, **job.kv}, {**case.v2, **job.v2}, {**case.classes, **job.classes}
    if kernels is not None and (kv != job.kv or v2 != job.v2 or classes != job.classes):
        try:
            kernels = counting(plugins_for(job.kernel, kv, backend, v2=v2, classes=classes))
        except plugin.PluginError as e:
            send(Result("config-error", message=str(e)))
            return
    case.kv, case.v2, case.classes = kv, v2, classes  # what the report's replay line names
    if kernels is not None and case.world is not None:
        # A world a class cannot be built for is the user's choice of class, not a finding.
        refusal = plugin.world_refusal(kernels, case.world)
        if refusal is not None:
            send(Result("config-error", message=refusal))
            return
    strict = job.strict_nan or case.strict_nan  # a case found strict replays strict
    if kernels is not None:
        kernels = dataclasses.replace(kernels, strict_nan=strict)
    if job.whole_run:
        assert kernels is not None
        _replay_whole_run(job, case, case_path, kernels, backend, send)
        return
    journal = Journal(Path(job.journal)) if job.journal else None
    if journal is not None:
        journal.start({"kind": case.kind, "kernel": case.kernel, "device": backend.describe(),
                       "world": case.world.to_json() if case.world else None, "call": case.call})

    def on_step(i: int, step: dict[str, Any]) -> None:
        if job.verbose:
            send(Log(f"step {i + 1}: {describe_step(step)}"))
        if journal is not None:
            journal.write(step)

    kernel: Callable | None
    if case.kind == "kv-call":
        kernel = kv_kernel
        outcome = run_kv_call(case.call or {}, kv_kernel, backend.device, strict)  # type: ignore[arg-type]
    elif case.kind == "v2-call":
        kernel = v2_kernel
        outcome = run_v2_call(case.call or {}, v2_kernel, backend.device)  # type: ignore[arg-type]
    elif case.kind == "slot-call":
        assert kernels is not None
        kernel = kernels.slot
        outcome = run_slot_call(case.call or {}, kernels.slot, backend)
    else:
        assert kernels is not None
        kernel = kernels.slot
        outcome = replay_lockstep(case, kernels, backend, on_step=on_step)
    if journal is not None:
        journal.close()
    if outcome.passed:
        send(Result("pass", device=backend.describe()))
        return
    send(Result("fail", device=backend.describe(),
                failure=describe_failure(case, outcome, backend, case_path, kernel=kernel, verbose=job.verbose)))


def _replay_whole_run(job: Job, case: Case, case_path: Path, kernels: Plugins, backend: device.Backend,
                      send: Send) -> None:
    if case.whole_run is None:
        send(Result("config-error", message=f"{case_path} keeps no whole run to replay"))
        return
    journal = Journal(Path(job.journal)) if job.journal else None

    def on_program(part: Case) -> None:
        if journal is not None:
            journal.start({"kind": part.kind, "kernel": part.kernel, "device": backend.describe(),
                           "world": part.world.to_json() if part.world else None, "call": part.call})

    outcome, part, which = replay_whole_run(case.whole_run, kernels, backend, on_program,
                                            on_step=(lambda i, step: journal.write(step)) if journal else None)
    if journal is not None:
        journal.close()
    if outcome.passed or part is None:
        send(Result("pass", device=backend.describe()))
        return
    title = f"blocktable: the whole run that found {case_path.name} fails again, at {which}"
    send(Result("fail", device=backend.describe(),
                failure=describe_failure(part, outcome, backend, case_path, title, kernels.slot, job.verbose)))
