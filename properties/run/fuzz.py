"""`blocktable fuzz`, the work done in the child process.

The contract's worked examples first (a kernel that gets those wrong needs no
fuzzing), then the lockstep machines in seeded chunks until the example count or
the time is reached. A failure is shrunk by Hypothesis, replayed from a fresh start
in this process, and sent to the parent with its report and the case as JSON and
the whole run that found it (run/failure.py); the parent replays the case in a
fresh process before it writes the case file (run/confirm.py). Every step is
journaled before it runs (run/journal.py).
"""

from __future__ import annotations

import json
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from blocktable import device
from blocktable.properties.cases.case import Case, provenance
from blocktable.properties.cases.credentials import masked
from blocktable.properties.lockstep.driver import Lockstep
from blocktable.properties.lockstep.machine import Recorder, make_machine
from blocktable.properties.outcome import Outcome
from blocktable.properties.run import profiles
from blocktable.properties.run.budget import OutOfTime
from blocktable.properties.run.calls import calls
from blocktable.properties.run.child import Send
from blocktable.properties.run.database import DEFAULT_FOLDER, namespace, open_database, password
from blocktable.properties.run.failure import device_name, send_failure
from blocktable.properties.run.journal import Journal
from blocktable.properties.run.messages import Job, Log, Progress, Result, Stats
from blocktable.properties.run.prepare import prepare
from blocktable.properties.run.replay import replay_lockstep
from blocktable.properties.slot.call import run_slot_call
from blocktable.properties.slot.examples import SPEC_EXAMPLES

# Examples per seeded chunk when fuzzing for a time budget. Each chunk is a fresh
# Hypothesis run (its own seed, its simplest programs first): a long run spends more
# of its time mutating programs it has already run, and reached several of the
# mutation gate's bugs far later (docs/results.md).
CHUNK_FOR_TIME = 40
# Programs of the whole run a case keeps when its failure does not repeat alone: the
# last ones before the failing program (a minutes-long run makes thousands).
WHOLE_RUN_LIMIT = 1000


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
        self.pending: list[tuple[int, Lockstep]] = []  # (ordinal, run) not yet folded in
        # The whole run up to the first failing program, each {"world", "program"} as
        # JSON text: what a kernel that keeps state from call to call had been called
        # with before. Text, because the cyclic collector walks every list and dict.
        self.whole_run: deque[str] = deque(maxlen=WHOLE_RUN_LIMIT)
        self.whole_run_seen = 0
        # The failing program with the fewest steps met so far: what a case keeps when
        # the time is up before Hypothesis has finished shrinking.
        self.smallest: tuple[Any, list[dict[str, Any]]] | None = None

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
                if self.smallest is None or len(run.program) < len(self.smallest[1]):
                    self.smallest = (run.world, list(run.program))
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
                     examples_to_failure=self.examples_to_failure, calls=calls())


def fuzz_child(job: Job, send: Send) -> None:
    ready = prepare(job, send)
    if ready is None:
        return
    backend, kernels = ready
    kernel = kernels.slot
    out = Path(job.out or ".")
    spec = job.kernel
    journal = Journal(job.journal_path())
    described = backend.describe()  # once: on a GPU it asks the driver
    found_on = device_name(backend)  # the --device that replays it, kept in the journal and the case
    prov = provenance("interpreter" if backend.interpreted else described, seed=job.seed, profile=job.profile,
                      backend=described, replay_device=found_on)
    totals = _Totals(time.monotonic())

    send(Progress("contract examples", totals.stats()))  # set up: the parent may show progress now
    # A table class computes its own slot mappings: no slot-mapping kernel is under test.
    for index, example in enumerate(SPEC_EXAMPLES if kernels.table is None else ()):
        call = example.call()
        journal.start({"kind": "slot-call", "kernel": spec, "call": call, "device": described,
                       "replay_device": found_on})
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
        now = time.monotonic()
        if totals.first_failure is None and job.deadline is not None and now >= job.deadline:
            raise OutOfTime(shrinking=False)
        if totals.first_failure is not None and job.shrink_deadline is not None and now >= job.shrink_deadline:
            raise OutOfTime(shrinking=True)
        totals.examples += 1
        totals.pending.append((totals.examples, run))
        journal.start({"kind": "lockstep", "kernel": spec, "world": run.world.to_json(), "device": described,
                       "replay_device": found_on})
        run.on_step = journal.write
        now = time.monotonic()
        if now - last_sent[0] > 0.25:
            last_sent[0] = now
            send(Progress("lockstep", totals.stats()))

    deadline = job.deadline or (totals.start + 60 * job.minutes if job.minutes else None)
    chunk_index = 0
    recorder = Recorder()
    database = _database(job, backend)
    while True:
        if deadline is None:
            size = min((job.examples or 0) - totals.examples, profiles.MACHINE_BUDGET[job.profile][0])
        else:
            size = CHUNK_FOR_TIME
        if size <= 0 or (deadline is not None and time.monotonic() >= deadline):
            break
        machine = make_machine(kernels, backend, on_run=on_run, recorder=recorder)
        hypothesis_seed(job.seed * 100003 + chunk_index)(machine)
        chunk_index += 1
        try:
            run_state_machine_as_test(machine, settings=profiles.machine_settings(max_examples=size, database=database))
        except OutOfTime as stop:
            if not stop.shrinking:
                break
            journal.close()
            _send_unshrunk(send, job, totals, recorder, prov, kernels, backend, out, kernel)
            return
        except BaseException as failure:  # noqa: BLE001 - whatever failed, it failed
            if isinstance(failure, KeyboardInterrupt):
                raise
            if type(failure).__module__.split(".")[0] == "redis":  # the shared database, not the kernel
                journal.close()
                secret = password(job.database or "")
                send(Result("config-error", message=masked(f"the example database {job.database} failed: {failure}",
                                                           [secret])))
                return
            totals.fold()
            if recorder.build_failed_at is not None:
                totals.failed(recorder.build_failed_at, totals.examples + 1)
            last = recorder.run
            world = last.world if last is not None else recorder.world
            program = list(last.program) if last is not None else []
            case = Case("lockstep", spec, {}, world=world, program=program, provenance=prov, kv=dict(job.kv),
                        v2=dict(job.v2), classes=dict(job.classes), strict_nan=job.strict_nan,
                        whole_run=totals.whole_run_json(len(SPEC_EXAMPLES)))
            journal.close()
            outcome = replay_lockstep(case, kernels, backend)
            repeated = not outcome.passed
            if outcome.passed:  # report what Hypothesis saw; the parent says it did not repeat
                outcome = Outcome(False, failure, len(program) - 1 if program else None)
            send_failure(send, case, outcome, backend, out, totals.stats(), kernel=kernel, verbose=job.verbose,
                         repeated=repeated)
            return
        totals.fold()
    journal.close()
    send(Result("pass", device=backend.describe(), stats=totals.stats()))


def _send_unshrunk(send: Send, job: Job, totals: _Totals, recorder: Recorder, prov: dict[str, Any], kernels: Any,
                   backend: device.Backend, out: Path, kernel: Any) -> None:
    """The time ran out while Hypothesis shrank a finding: the smallest failing
    program met so far is the case, as found, and the run says so."""
    totals.fold()
    world, program = totals.smallest or (recorder.world, [])
    case = Case("lockstep", job.kernel, {}, world=world, program=program, provenance=prov, kv=dict(job.kv),
                v2=dict(job.v2), classes=dict(job.classes), strict_nan=job.strict_nan,
                whole_run=totals.whole_run_json(len(SPEC_EXAMPLES)))
    outcome = replay_lockstep(case, kernels, backend)
    repeated = not outcome.passed
    if outcome.passed:
        outcome = Outcome(False, AssertionError("the failing program passed when replayed in the same process"),
                          len(program) - 1 if program else None)
    send(Log(f"the time limit (--minutes) came before shrinking finished: the case keeps the failing program "
             f"as found ({len(program)} steps)"))
    send_failure(send, case, outcome, backend, out, totals.stats(), kernel=kernel, verbose=job.verbose,
                 repeated=repeated, note={"not_shrunk": "the time limit (--minutes) came before shrinking finished"})


def _database(job: Job, backend: device.Backend) -> Any:
    """The example database of this kernel on this device, or None. Every chunk
    reads it first (Hypothesis's reuse phase): a failure another process saved
    meanwhile is tried at the next chunk. The seed does not enter the key."""
    if job.database is None:
        return None
    local = str(Path(job.out) / DEFAULT_FOLDER) if job.out else None
    return open_database(job.database, namespace(job.kernel, device_name(backend)), job.database_readonly, local)
