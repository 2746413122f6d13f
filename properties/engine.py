"""`blocktable fuzz` and `blocktable replay`, the work done in the child process.

fuzz: the contract's worked examples first (a kernel that gets those wrong needs no
fuzzing), then the lockstep machines in seeded chunks until the example count or
the time is reached. A failure is shrunk by Hypothesis, replayed from a fresh start
in this process, rendered as a report and sent to the parent with the case as
JSON and the whole run that found it; the parent replays the case in a fresh
process before it writes the case file (blocktable/cli/fuzz.py). Every step is
journaled before it runs (properties/journal.py).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any, Callable

from blocktable import device, plugin
from blocktable.properties import fault, kv_world, profiles
from blocktable.properties.case import Case, load, provenance
from blocktable.properties.examples import SPEC_EXAMPLES
from blocktable.properties.journal import Journal
from blocktable.properties.messages import Failure, Job, Log, Message, Progress, Result, Stats
from blocktable.properties.reference_kernel import harness_kernels
from blocktable.properties.replay import Outcome, replay_lockstep, replay_whole_run, run_slot_call, slot_call
from blocktable.properties.report import render, where_text

Send = Callable[[Message], None]
# Examples per seeded chunk when fuzzing for a time budget. Each chunk is a fresh
# Hypothesis run (its own seed, its simplest programs first): a long run spends more
# of its time mutating programs it has already run, and reached several of the
# mutation gate's bugs far later (docs/results.md).
CHUNK_FOR_TIME = 40
# Programs of the whole run a case keeps when its failure does not repeat alone: the
# last ones before the failing program (a minutes-long run makes thousands).
WHOLE_RUN_LIMIT = 1000


def replay_command(case_path: Path, kernel: str, device_name: str) -> str:
    return f"blocktable replay {case_path} --kernel {kernel} --device {device_name}"


def prepare_backend(job: Job, send: Send) -> device.Backend | None:
    """The child's device and profile; None (a config-error result sent) on failure."""
    fault.exit_on_device_faults()
    try:
        backend = device.select(job.device)
    except (RuntimeError, ValueError) as e:
        send(Result("config-error", message=str(e)))
        return None
    os.environ[profiles.PROFILE_VARIABLE] = job.profile
    profiles.register_and_load()
    profiles.collect_less()
    profiles.import_every_module()  # after the backend: kernel modules read TRITON_INTERPRET
    return backend


def prepare(job: Job, send: Send, kv_kind: str | None = None) -> tuple[device.Backend, Any] | None:
    """The child's device, profile and kernel; None (a config-error result sent) on failure.
    `kv_kind` ("write", "copy", "gather"): `job.kernel` names a KV kernel of that kind
    (a "kv-call" case's), not a slot-mapping kernel."""
    backend = prepare_backend(job, send)
    if backend is None:
        return None
    try:
        kernel = plugin.load_kv(kv_kind, job.kernel) if kv_kind else plugin.load(job.kernel, harness_kernels())
        # The KV kernels the lockstep's KV worlds use (ours unless named).
        kv_world.select(plugin.load_kv_kernels(job.kv_write, job.kv_copy, job.kv_gather))
    except plugin.PluginError as e:
        # An import that raised: say where in the plug-in's file, on the one line.
        send(Result("config-error", message=str(e) + (where_text(e.__cause__) if e.__cause__ else "")))
        return None
    return backend, kernel


def prepare_kv(job: Job, send: Send) -> plugin.KVKernels | None:
    """The job's three KV kernels (ours where it names none); None (a config-error
    result sent) when one cannot be loaded."""
    try:
        return plugin.load_kv_kernels(job.kv_write, job.kv_copy, job.kv_gather)
    except plugin.PluginError as e:
        send(Result("config-error", message=str(e) + (where_text(e.__cause__) if e.__cause__ else "")))
        return None


def kernel_files(kernel: Any) -> list[str]:
    """The file the kernel function is defined in, so that a report shows its frames
    even when it is an installed package's."""
    code = getattr(kernel, "__code__", None)
    return [code.co_filename] if code is not None else []


def _device_name(backend: device.Backend) -> str:
    return "cpu" if backend.interpreted else "cuda"


def case_config(case: Case) -> str:
    """The case's world or call, one line, as reports show it."""
    if case.kind == "kv-call":
        from blocktable.properties.kv_calls import call_text as kv_call_text

        return kv_call_text(case.call or {})
    return case.world.describe() if case.world else call_text(case.call or {})


def report_failure(case: Case, outcome: Outcome, backend: device.Backend, case_path: Path,
                   title: str = "blocktable found a discrepancy", kernel: Any = None, verbose: bool = False) -> str:
    kernels = "; ".join([case.kernel, *(f"kv-{kind} {spec}" for kind, spec in case.kv.items())])
    return render(kernel=kernels, device=backend.describe(), error=outcome.error, config_text=case_config(case),
                  program=case.program if case.kind == "lockstep" else None, failed_step=outcome.failed_step,
                  replay_command=replay_command(case_path, case.kernel, _device_name(backend)), run=outcome.run,
                  title=title, kernel_files=kernel_files(kernel), verbose=verbose)


def config_text(name: str, config: dict[str, int], requests: int, tokens: int, max_num_tokens: int) -> str:
    """One slot-mapping call's configuration and size, as reports show it."""
    c = config
    return (f"{name}: K={c.get('kv_block_size')} B={c.get('kernel_block_size')} "
            f"W={c.get('cp_world_size', 1)} R={c.get('cp_rank', 0)} I={c.get('cp_interleave', 1)}, "
            f"{requests} requests, {tokens} tokens, Tmax {max_num_tokens}")


def call_text(call: dict[str, Any]) -> str:
    return config_text(call.get("name", "call"), call.get("config", {}), len(call.get("query_start_loc", [0])) - 1,
                       len(call.get("positions", [])), call.get("max_num_tokens"))


def describe_failure(case: Case, outcome: Outcome, backend: device.Backend, case_path: Path,
                     title: str = "blocktable found a discrepancy", kernel: Any = None,
                     verbose: bool = False) -> Failure:
    error = outcome.error
    return Failure(kind=case.kind, what=getattr(error, "what", type(error).__name__), message=str(error),
                   config=case_config(case), step=outcome.failed_step, program_steps=len(case.program),
                   case=str(case_path), report=report_failure(case, outcome, backend, case_path, title, kernel, verbose),
                   error=f"{type(error).__name__}: {error}" if error is not None else "",
                   first=slot_mismatch(error),
                   call=(case.call or {}).get("name") if case.kind in ("slot-call", "kv-call") else None)


def send_failure(send: Send, case: Case, outcome: Outcome, backend: device.Backend, out: Path, stats: Stats,
                 title: str = "blocktable found a discrepancy", kernel: Any = None, verbose: bool = False,
                 repeated: bool | None = None) -> None:
    """Send the result with the failure, its rendered report and the case as JSON.
    The case file is not written here: the parent first replays the case in a fresh
    process, records whether it failed there, and writes the file to `failure.case`."""
    case.failure = {"what": getattr(outcome.error, "what", type(outcome.error).__name__),
                    "message": str(outcome.error), "step": outcome.failed_step}
    path = case.path_in(out)
    failure = describe_failure(case, outcome, backend, path, title, kernel, verbose)
    failure.case_data = case.to_json()
    failure.repeated_in_process = repeated
    send(Result("fail", device=backend.describe(), stats=stats, failure=failure))


class _Totals:
    """The lockstep's running totals. Finished runs are folded in and let go when
    the next starts: keeping a chunk's runs alive (each with its device caches and
    histories) cost memory and made every full collection walk them all."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.examples = self.steps = self.steps_with_tokens = self.operations = 0
        self.events: Counter[str] = Counter()
        self.first_failure: float | None = None
        self.examples_to_failure: int | None = None
        self.pending: list[tuple[int, Any]] = []  # (ordinal, run) not yet folded in
        # The whole run up to the first failing program, each {"world", "program"} as
        # JSON text: what a kernel that keeps state from call to call had been called
        # with before. Text, because the cyclic collector walks every list and dict.
        self.whole_run: deque[str] = deque(maxlen=WHOLE_RUN_LIMIT)
        self.whole_run_seen = 0

    def failed(self, when: float, ordinal: int | None) -> None:
        if self.first_failure is None:
            self.first_failure, self.examples_to_failure = when, ordinal

    def fold(self) -> None:
        for ordinal, run in self.pending:
            if self.first_failure is None:  # Hypothesis's shrinking runs come after: not part of it
                self.whole_run.append(json.dumps({"world": run.world.to_json(), "program": run.program}))
                self.whole_run_seen += 1
            if run.failed_at is not None:
                self.failed(run.failed_at, ordinal)
            self.steps += run.steps_checked
            self.steps_with_tokens += run.steps_with_tokens
            self.operations += len(run.program)
            self.events.update(run.events)
        self.pending.clear()

    def whole_run_json(self, contract_examples: int) -> dict[str, Any]:
        return {"contract_examples": contract_examples, "programs": [json.loads(p) for p in self.whole_run],
                "dropped": self.whole_run_seen - len(self.whole_run)}

    def stats(self) -> Stats:
        first = self.first_failure
        return Stats(examples=self.examples, steps=self.steps, steps_with_tokens=self.steps_with_tokens,
                     operations=self.operations, events=dict(self.events), elapsed=time.monotonic() - self.start,
                     first_failure_s=None if first is None else first - self.start,
                     examples_to_failure=self.examples_to_failure)


def fuzz_child(job: Job, send: Send) -> None:
    from hypothesis import seed as hypothesis_seed
    from hypothesis.stateful import run_state_machine_as_test

    from blocktable.properties.machine import Recorder, make_machine

    ready = prepare(job, send)
    if ready is None:
        return
    backend, kernel = ready
    out = Path(job.out or ".")
    spec = job.kernel
    journal = Journal(Path(job.journal))
    described = backend.describe()  # once: on a GPU it asks the driver
    prov = provenance("interpreter" if backend.interpreted else described, seed=job.seed, profile=job.profile)
    totals = _Totals(time.monotonic())

    send(Progress("contract examples", totals.stats()))  # set up: the parent may show progress now
    for index, example in enumerate(SPEC_EXAMPLES):
        qsl, positions, table = example.inputs()
        call = slot_call(example.name, example.kwargs(), qsl, positions, table, example.tmax)
        journal.start({"kind": "slot-call", "kernel": spec, "call": call, "device": described})
        outcome = run_slot_call(call, kernel, backend)
        if not outcome.passed:
            totals.failed(time.monotonic(), 0)
            journal.close()
            case = Case("slot-call", spec, {}, call=call, provenance=prov,
                        whole_run=totals.whole_run_json(index + 1))
            send_failure(send, case, outcome, backend, out, totals.stats(), kernel=kernel, verbose=job.verbose)
            return
    send(Progress("contract examples passed", totals.stats()))

    last_sent = [0.0]

    def on_run(run: Any) -> None:
        totals.fold()  # the run before this one has ended
        totals.examples += 1
        totals.pending.append((totals.examples, run))
        journal.start({"kind": "lockstep", "kernel": spec, "world": run.world.to_json(), "device": described})
        run.on_step = journal.write
        now = time.monotonic()
        if now - last_sent[0] > 0.25:
            last_sent[0] = now
            send(Progress("lockstep", totals.stats()))

    deadline = totals.start + 60 * job.minutes if job.minutes else None
    chunk_index = 0
    recorder = Recorder()
    database = _database(job, backend)
    while True:
        if deadline is None:
            size = min(job.examples - totals.examples, profiles.MACHINE_BUDGET[job.profile][0])
        else:
            size = CHUNK_FOR_TIME
        if size <= 0 or (deadline is not None and time.monotonic() >= deadline):
            break
        machine = make_machine(kernel, backend, on_run=on_run, recorder=recorder)
        hypothesis_seed(job.seed * 100003 + chunk_index)(machine)
        chunk_index += 1
        try:
            run_state_machine_as_test(machine, settings=profiles.machine_settings(max_examples=size, database=database))
        except BaseException as failure:  # noqa: BLE001 - whatever failed, it failed
            if isinstance(failure, KeyboardInterrupt):
                raise
            if type(failure).__module__.split(".")[0] == "redis":  # the shared database, not the kernel
                journal.close()
                send(Result("config-error", message=f"the example database {job.database} failed: {failure}"))
                return
            totals.fold()
            if recorder.build_failed_at is not None:
                totals.failed(recorder.build_failed_at, totals.examples + 1)
            last = recorder.run
            world = last.world if last is not None else recorder.world
            program = list(last.program) if last is not None else []
            case = Case("lockstep", spec, {}, world=world, program=program, provenance=prov, kv=kv_specs(job),
                        whole_run=totals.whole_run_json(len(SPEC_EXAMPLES)))
            journal.close()
            outcome = replay_lockstep(case, kernel, backend)
            repeated = not outcome.passed
            if outcome.passed:  # report what Hypothesis saw; the parent says it did not repeat
                outcome = Outcome(False, failure, len(program) - 1 if program else None, last)
            send_failure(send, case, outcome, backend, out, totals.stats(), kernel=kernel, verbose=job.verbose,
                         repeated=repeated)
            return
        totals.fold()
    journal.close()
    send(Result("pass", device=backend.describe(), stats=totals.stats()))


def _database(job: Job, backend: device.Backend) -> Any:
    """The example database of this kernel on this device, or None. Every chunk
    reads it first (Hypothesis's reuse phase): a failure another process saved
    meanwhile is tried at the next chunk. The seed does not enter the key."""
    if job.database is None:
        return None
    from blocktable.properties.database import DEFAULT_FOLDER, namespace, open_database

    local = str(Path(job.out) / DEFAULT_FOLDER) if job.out else None
    return open_database(job.database, namespace(job.kernel, _device_name(backend)), job.database_readonly, local)


def kv_specs(job: Job) -> dict[str, str]:
    """The KV plug-ins a job names, by kind (ours for a kind not named)."""
    return {kind: spec for kind, spec in (("write", job.kv_write), ("copy", job.kv_copy), ("gather", job.kv_gather))
            if spec}


def replay_child(job: Job, send: Send) -> None:
    """Replay one case (a file, or its JSON before the file is written); a "pass" or
    "fail" result with the failure. With `job.whole_run`, the case's whole run instead."""
    ready = prepare(job, send, kv_kind=_kv_kind(job))
    if ready is None:
        return
    backend, kernel = ready
    try:
        if job.case_data is not None:
            case = Case.from_json(job.case_data)
            case_path = Path(job.case or "case.json")
        else:
            case_path = Path(job.case)
            case = load(case_path)
    except ValueError as e:  # the parent checks first; a file changed since is still no kernel's fault
        send(Result("config-error", message=str(e)))
        return
    case.kernel = job.kernel
    if case.kv and not kv_specs(job):  # the plug-ins the case ran with, unless the replay names others
        try:
            kv_world.select(plugin.load_kv_kernels(case.kv.get("write"), case.kv.get("copy"), case.kv.get("gather")))
        except plugin.PluginError as e:
            send(Result("config-error", message=str(e)))
            return
    if job.whole_run:
        _replay_whole_run(job, case, case_path, kernel, backend, send)
        return

    def show(i: int, step: dict[str, Any]) -> None:
        if job.verbose:
            from blocktable.properties.report import describe_step

            send(Log(f"step {i + 1}: {describe_step(step)}"))

    if job.journal:
        journal = Journal(Path(job.journal))
        journal.start({"kind": case.kind, "kernel": case.kernel, "device": backend.describe(),
                       "world": case.world.to_json() if case.world else None, "call": case.call})
    else:
        journal = None
    if case.kind == "slot-call":
        outcome = run_slot_call(case.call or {}, kernel, backend)
    elif case.kind == "kv-call":
        from blocktable.properties.kv_calls import run_kv_call

        outcome = run_kv_call(case.call or {}, kernel, backend.device)
    else:
        def step_hook(i: int, step: dict[str, Any]) -> None:
            show(i, step)
            if journal is not None:
                journal.write(step)
        outcome = replay_lockstep(case, kernel, backend, on_step=step_hook)
    if journal is not None:
        journal.close()
    if outcome.passed:
        send(Result("pass", device=backend.describe()))
        return
    send(Result("fail", device=backend.describe(),
                failure=describe_failure(case, outcome, backend, case_path, kernel=kernel, verbose=job.verbose)))


def _kv_kind(job: Job) -> str | None:
    """The op of a "kv-call" case (its kernel is a KV kernel of that kind), else None.
    Read before the case is checked: the kernel is loaded first. A file that cannot
    be read is None here and reported when the case is loaded."""
    data = job.case_data
    if data is None and job.case:
        try:
            data = json.loads(Path(job.case).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    if isinstance(data, dict) and data.get("kind") == "kv-call" and isinstance(data.get("call"), dict):
        op = data["call"].get("op")
        return op if op in plugin.KV_KINDS else None
    return None


def _replay_whole_run(job: Job, case: Case, case_path: Path, kernel: Any, backend: device.Backend,
                      send: Send) -> None:
    if case.whole_run is None:
        send(Result("config-error", message=f"{case_path} keeps no whole run to replay"))
        return
    journal = Journal(Path(job.journal)) if job.journal else None

    def on_program(part: Case) -> None:
        if journal is not None:
            journal.start({"kind": part.kind, "kernel": part.kernel, "device": backend.describe(),
                           "world": part.world.to_json() if part.world else None, "call": part.call})

    outcome, part, which = replay_whole_run(case.whole_run, job.kernel, kernel, backend, on_program,
                                            on_step=(lambda i, step: journal.write(step)) if journal else None)
    if journal is not None:
        journal.close()
    if outcome.passed or part is None:
        send(Result("pass", device=backend.describe()))
        return
    title = f"blocktable: the whole run that found {case_path.name} fails again, at {which}"
    send(Result("fail", device=backend.describe(),
                failure=describe_failure(part, outcome, backend, case_path, title, kernel, job.verbose)))


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
