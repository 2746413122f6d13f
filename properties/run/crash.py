"""A kernel that kills its process: the case its crash journal leaves, and
shrinking a crashing lockstep program.

Hypothesis cannot shrink a crash: the process that would shrink is the one that
died. So the parent does it, with a child that replays candidate programs one
after another and answers for each; a candidate that kills the child is a smaller
crash, and only then is a fresh child started. Candidates come from removing runs
of steps, halving the run length down to single steps (the "ddmin" idea), then
from making each integer argument as small as the crash allows. A candidate counts
only if the child dies the same way (same signal or exit status); everything up to
the step it died in, as the child's journal shows, becomes the new program. The
world (groups, pool, DCP) is not simplified.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blocktable.properties.cases.case import Case, provenance
from blocktable.properties.report.describe import config_text
from blocktable.properties.run import launch
from blocktable.properties.run.child import HUNG_EXIT, describe_exit, hung, sigint_ignored
from blocktable.properties.run.journal import Journal
from blocktable.properties.run.launch import Start
from blocktable.properties.run.messages import Answer, Job, Message, Ready
from blocktable.properties.run.prepare import prepare
from blocktable.properties.run.replay import replay_lockstep
from blocktable.properties.world import WorldConfig

Program = list[dict[str, Any]]
ANSWER_TIMEOUT_S = 120.0  # one replay; longer counts as "did not crash"
TIMED_OUT = Answer(passed=True)  # what a replay that outlasts ANSWER_TIMEOUT_S counts as (compared by identity)


def _replayer(start: Start, programs: Any, answers: Any, heartbeat: Any) -> None:
    """The child: replay each program it is sent, journaling every step first."""
    (job,) = start.begin()
    from blocktable.properties.run.calls import watch

    watch(heartbeat)
    ready = prepare(job, answers.put)
    if ready is None:
        return
    backend, kernels = ready
    answers.put(Ready())
    assert job.world is not None
    world = WorldConfig.from_json(job.world)
    journal = Journal(job.journal_path())
    while True:
        program = programs.get()
        if program is None:
            return
        journal.start({"kind": "lockstep", "world": job.world})
        case = Case("lockstep", job.kernel, {}, world=world, program=program)
        outcome = replay_lockstep(case, kernels, backend, on_step=lambda i, step: journal.write(step))
        answers.put(Answer(outcome.passed))


class Replayer:
    """A child that replays programs on request and may die doing so."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.journal = job.journal_path()
        self.children_started = 0
        self.replays = 0
        self._process: Any = None

    def _start(self) -> None:
        context = launch.context()
        self._programs, self._answers = context.Queue(), context.Queue()
        self._heartbeat = context.RawValue("d", 0.0)
        self._hung = False
        with sigint_ignored():
            self._process = context.Process(target=_replayer, args=(Start.of(self.job), self._programs,
                                                                     self._answers, self._heartbeat), daemon=True)
            self._process.start()
        self.children_started += 1
        first = self._wait()
        if not isinstance(first, Ready):
            raise RuntimeError(f"the replaying child could not start: {first}")

    def _wait(self) -> Message | None:
        """The child's next message; None if it died first, TIMED_OUT (the child
        killed) if it did not answer in time."""
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                return self._answers.get(timeout=0.2)
            except queue.Empty:
                if not self._process.is_alive():
                    return None
                if hung(self._heartbeat, self.job.call_timeout):  # a hang is this crash's kind of death
                    self._process.kill()
                    self._process.join()
                    self._hung = True
                    return None
        self._process.kill()
        self._process.join()
        return TIMED_OUT

    def crash(self, program: Program) -> tuple[int | None, Program] | None:
        """(exit code, the steps run up to and including the fatal one) if replaying
        `program` kills the child; None if it passes, fails normally or hangs."""
        if self._process is None or not self._process.is_alive():
            self._start()
        self.replays += 1
        self._programs.put(program)
        answer = self._wait()
        if answer is not None:
            if answer is TIMED_OUT:
                self._process = None
            return None
        self._process.join()
        exitcode, self._process = (HUNG_EXIT if self._hung else self._process.exitcode), None
        _, steps = Journal.read(self.journal)
        return exitcode, steps

    def close(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._programs.put(None)
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()


@dataclass
class Shrunk:
    program: Program
    reproduced: bool  # the original program crashed again, the same way
    replays: int
    children: int
    seconds: float


def shrink_program(program: Program, crashes: Callable[[Program], Program | None],
                   out_of_time: Callable[[], bool]) -> Program:
    """Remove runs of steps, longest first, keeping each removal after which
    `crashes` still returns a (possibly shorter) crashing program."""
    size = max(1, len(program) // 2)
    while True:
        i = 0
        while i < len(program) and not out_of_time():
            smaller = crashes(program[:i] + program[i + size:])
            if smaller is not None and len(smaller) < len(program):
                program = smaller
            else:
                i += size
        if size == 1 or out_of_time():
            return program
        size //= 2


def _smaller(value: Any) -> list[int]:
    """Simpler integers to try in place of `value`, simplest first."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return []
    return sorted({0, 1, value // 2, value - 1} - {value})


def _with(step: dict[str, Any], key: str, index: int | None, value: int) -> dict[str, Any]:
    changed = dict(step)
    if index is None:
        changed[key] = value
    else:
        changed[key] = list(step[key])
        changed[key][index] = value
    return changed


def _zeroed(value: list[Any]) -> list[Any]:
    """A list argument with every positive integer in it made 0."""
    return [0 if isinstance(v, int) and not isinstance(v, bool) and v > 0 else v for v in value]


def simplify_arguments(program: Program, crashes: Callable[[Program], Program | None],
                       out_of_time: Callable[[], bool]) -> Program:
    """Make each integer argument (and each integer in a list argument) as small as
    the crash allows: 0, 1, half or one less, repeated while one of them works. A
    list argument is first tried all at 0 at once: a crash that does not care about
    its values (a prompt's token ids, a step's query lengths) then costs one replay
    instead of one per element, each of which, crashing, costs a fresh process."""
    for i in range(len(program)):  # accepted candidates keep the length
        places: list[tuple[str, int | None]] = []
        for key, value in program[i].items():
            if isinstance(value, list):
                zeroed = _zeroed(value)
                if zeroed != value and not out_of_time():
                    candidate = program[:i] + [{**program[i], key: zeroed}] + program[i + 1:]
                    smaller = crashes(candidate)
                    if smaller is not None and len(smaller) == len(program):
                        program = smaller
                        continue  # every element is as small as it gets
                places += [(key, j) for j in range(len(value))]
            elif key != "op":
                places.append((key, None))
        for key, j in places:
            changed = True
            while changed and not out_of_time():
                changed = False
                current = program[i][key] if j is None else program[i][key][j]
                for value in _smaller(current):
                    candidate = program[:i] + [_with(program[i], key, j, value)] + program[i + 1:]
                    smaller = crashes(candidate)
                    if smaller is not None and len(smaller) == len(program):
                        program, changed = smaller, True
                        break
    return program


def shrink_crash(job: Job, world: dict[str, Any], program: Program, exitcode: int | None,
                 seconds: float, on_progress: Callable[[int, int], None] | None = None) -> Shrunk:
    """The smallest program found within `seconds` that kills a fresh child the
    way the original did. job: as for the fuzz child (kernel, device, profile, journal)."""
    start = time.monotonic()
    replayer = Replayer(dataclasses.replace(job, world=world))

    def crashes(candidate: Program) -> Program | None:
        got = replayer.crash(candidate)
        if got is None or got[0] != exitcode:
            return None
        if on_progress is not None:
            on_progress(len(program), len(got[1]))
        return got[1]

    try:
        again = crashes(program)
        if again is None:
            return Shrunk(program, False, replayer.replays, replayer.children_started, time.monotonic() - start)
        out_of_time = lambda: time.monotonic() - start > seconds  # noqa: E731
        smallest = shrink_program(again, crashes, out_of_time)
        simpler = simplify_arguments(smallest, crashes, out_of_time)
        if simpler != smallest:  # smaller arguments may make more steps unnecessary
            simpler = shrink_program(simpler, crashes, out_of_time)
        smallest = simpler
    finally:
        replayer.close()
    return Shrunk(smallest, True, replayer.replays, replayer.children_started, time.monotonic() - start)


# -- the case a crash journal leaves ----------------------------------------------------


def crash_case(journal: Path, exitcode: int | None, call_timeout: float | None = None) -> tuple[Case | None, str, str]:
    """A case from the journal of a child that died mid-step: (case, what happened,
    the device it ran on). The case is None where there is nothing to replay: a
    stateless batch, or a death before the first step."""
    try:
        header, steps = Journal.read(journal)
    except (OSError, ValueError):
        return None, f"blocktable: the process running the kernel {describe_exit(exitcode, call_timeout)} before " \
                     f"its first step", \
            "unknown"
    if header.get("kind") == "stateless-batch":
        return None, stateless_crash(header, exitcode), header.get("device", "unknown")
    if header.get("kind") in ("kv-stateless-batch", "v2-stateless-batch"):
        return None, kv_stateless_crash(header, exitcode), header.get("device", "unknown")
    if header.get("kind") in ("slot-call", "kv-call", "v2-call"):
        case = Case(header["kind"], header["kernel"], {}, call=header["call"])
    else:
        case = Case("lockstep", header["kernel"], {}, world=WorldConfig.from_json(header["world"]), program=steps)
    device = header.get("device", "unknown")
    case.provenance = provenance(device, exitcode=exitcode, backend=device,
                                 **({"replay_device": header["replay_device"]} if "replay_device" in header else {}))
    return case, describe_crash(case, exitcode, call_timeout), device


def describe_crash(case: Case, exitcode: int | None, call_timeout: float | None = None) -> str:
    """Set the case's failure record from its (possibly shrunk) program; return the message."""
    how = describe_exit(exitcode, call_timeout)
    steps = case.program
    if case.kind in ("slot-call", "kv-call", "v2-call"):
        where = f"while running {(case.call or {}).get('name', 'a stateless call')}"
    else:
        where = f"during step {len(steps)}" if steps else "while building the world"
    case.failure = {"what": "crash", "message": f"the process {how} {where}", "step": len(steps) - 1 if steps else None}
    return f"the process running the kernel {how} {where}"


def stateless_crash(header: dict[str, Any], exitcode: int | None) -> str:
    """A batch of `--stateless` is too big to journal: say which one, and how to
    run it again."""
    config = config_text(f"batch {header['batch']}", header["config"], header["requests"], header["tokens"],
                         header["max_num_tokens"])
    return (f"blocktable: the process running the kernel {describe_exit(exitcode)} during stateless batch "
            f"{header['batch']}\n  kernel:  {header['kernel']}\n  device:  {header.get('device', 'unknown')}\n"
            f"  config:  {config}\n  no case file (the batch is too big to journal); the same seed "
            f"repeats it: blocktable fuzz --stateless --seed {header['seed']} --kernel {header['kernel']}"
            + (f" --max-tokens {header['max_tokens']}" if "max_tokens" in header else ""))


def kv_stateless_crash(header: dict[str, Any], exitcode: int | None) -> str:
    """A call of the KV or V2 stateless mode is not journaled whole: say which, and how
    to run it again."""
    family = "v2" if header["kind"] == "v2-stateless-batch" else "kv"
    return (f"blocktable: the process running the {family}-{header['op']} kernel {describe_exit(exitcode)} during "
            f"stateless call {header['batch']}\n  kernel:  {header['kernel']}\n"
            f"  device:  {header.get('device', 'unknown')}\n  config:  {header['call']}\n"
            f"  no case file (the call is not journaled whole); the same seed and kernels repeat it: "
            f"blocktable fuzz --stateless --seed {header['seed']} {header['flags']}")
