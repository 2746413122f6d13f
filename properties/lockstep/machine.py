"""Hypothesis drives the lockstep driver: a RuleBasedStateMachine whose rules turn
their explicit arguments into steps (no `st.data()` draws, so a printed failing
program pastes back and shrinks well).

`make_machine(kernels, backend)` binds what is under test. A `Recorder` passed in
keeps the last run: when Hypothesis finishes shrinking it replays the minimal
failing example last, so that run's `program` is the shrunk step program.

The machine class's source text is its key in the example database (Hypothesis
hashes it): fuzzing hosts that share a database find each other's failures only
while the text is the same, and tests/properties/run/test_database.py holds it to
the text a saved database was made with. Change what the class does through the
names it calls (the driver, the strategies), not its text, unless a new corpus is
wanted.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hypothesis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from blocktable.device import Backend
from blocktable.plugin import Plugins, declared_free_orders, declared_uniform_groups
from blocktable.properties.lockstep import strategies
from blocktable.properties.lockstep.driver import Lockstep
from blocktable.properties.lockstep.prompts import noise, prompt_from
from blocktable.properties.lockstep.schema import REJECTION_KINDS
from blocktable.properties.world import WorldConfig

WHICH = st.integers(0, 15)  # an index into whatever the rule chooses among


@dataclass
class Recorder:
    """What the machine's last program was, for the caller to report once Hypothesis
    has finished: its world (kept even when the implementation refused to build
    it), its run, and when building first failed (time.monotonic)."""

    world: WorldConfig | None = None
    run: Lockstep | None = None
    build_failed_at: float | None = None


def make_machine(kernels: Plugins, backend: Backend, worlds: st.SearchStrategy[WorldConfig] | None = None,
                 on_run: Callable[[Lockstep], None] | None = None,
                 recorder: Recorder | None = None) -> type[RuleBasedStateMachine]:
    worlds = worlds if worlds is not None else strategies.worlds()
    if kernels.pool is not None:  # the worlds free in an order the pool class follows
        worlds = worlds.map(functools.partial(strategies.free_order_of, declared_free_orders(kernels.pool, "pool")))
    if kernels.table is not None and declared_uniform_groups(kernels.table, "table"):
        worlds = worlds.map(strategies.uniform_groups_of)  # every group sharded, one interleave
    if kernels.table_v2 is not None:
        worlds = worlds.map(strategies.with_v2_tables)
    return _machine(kernels, backend, worlds, on_run, recorder if recorder is not None else Recorder())


def _machine(kernel: Plugins, backend: Backend, world_strategy: st.SearchStrategy[WorldConfig],
             on_run: Callable[[Lockstep], None] | None, recorder: Recorder) -> type[RuleBasedStateMachine]:
    """The machine class. Its body calls what is under test `kernel`, the name from
    when the slot-mapping kernel was all there was: its text is the database key."""

    class LockstepMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.run: Lockstep | None = None

        def apply(self, **step: Any) -> Any:
            assert self.run is not None
            return self.run.apply(step)

        @initialize(world=world_strategy, length=strategies.prompt_parts()["length"],
                    salt=strategies.prompt_parts()["salt"])
        def build(self, world: WorldConfig, length: int, salt: int) -> None:
            """The world and its first request: Hypothesis switches some rules off for
            a whole program (swarm testing), and a program without add_request would
            otherwise schedule no token at all. One add only, so that a shrunk
            program keeps the order of its later adds and steps. `length` and `salt`:
            its prompt, where the world caches prefixes."""
            recorder.run, recorder.world = None, world
            try:
                self.run = Lockstep(world, kernel, backend, on_event=hypothesis.event)
            except Exception:
                if recorder.build_failed_at is None:
                    recorder.build_failed_at = time.monotonic()
                raise
            recorder.run = self.run
            if on_run is not None:
                on_run(self.run)
            if world.prefix_caching:
                self.apply(op="add", prompt=prompt_from([], 0, 0, noise(salt, length), world.max_model_len))
            else:
                self.apply(op="add")

        @precondition(lambda self: self.run.free_row() is not None and not self.run.world.prefix_caching)
        @rule()
        def add_request(self) -> None:
            self.apply(op="add")

        @precondition(lambda self: self.run.free_row() is not None and self.run.world.prefix_caching)
        @rule(**strategies.prompt_parts())
        def add_prompt(self, source: int, cut: int, whole: bool, length: int, salt: int, prefill: bool) -> None:
            """A request whose prompt extends or branches from an earlier one's tokens
            (docs/contract.md §8: that is where hits come from); `prefill`: a step then
            computes the rest of its prompt at once, as an engine's first step for it
            does, so that its full blocks are cached for the requests after it."""
            run = self.run
            block = math.lcm(*(lay.tokens_per_block for lay in run.layouts)) if whole else 1
            prompt = prompt_from(run.prompts.seen, source, cut, noise(salt, length), run.world.max_model_len, block)
            self._admit(prompt, prefill)

        def _admit(self, prompt: list[int], prefill: bool) -> None:
            run = self.run
            rid = self.apply(op="add", prompt=prompt)
            request = run.requests[rid]
            if prefill and len(prompt) > request.written:
                query = [0] * run.world.max_num_reqs
                query[request.row] = len(prompt) - request.written
                self.apply(op="step", query=query, pad=0)

        @precondition(lambda self: self.run.world.prefix_caching and self.run.live())
        @rule(which=WHICH, length=strategies.next_turn_lengths(), salt=strategies.prompt_parts()["salt"],
              prefill=st.booleans(), others=st.integers(0, 2))
        def next_turn(self, which: int, length: int, salt: int, prefill: bool, others: int) -> None:
            """A conversation's next turn: a request finishes, and a new one's prompt is
            all its tokens and a few more (or none: the same prompt again, whose hit the
            len - 1 rule holds back), so it hits the blocks just freed (ref 0). `others`
            requests finish in between: their blocks join the queue behind its blocks,
            where an admission fits with its first group's fresh blocks reaching past
            the head to a later group's hits (what admitting group by group gets wrong)."""
            run = self.run
            live = run.live()  # a running request: its row is free for the next turn
            rid = live[which % len(live)]
            tokens = run.prompts.tokens[rid][:run.slots(rid)]
            self.apply(op="finish", request=rid, clear=False)
            for other in run.live()[:others]:  # rid's row is free already
                self.apply(op="finish", request=other, clear=False)
            self._admit((tokens + noise(salt, length if tokens else max(1, length)))[:run.world.max_model_len],
                        prefill)

        @precondition(lambda self: self.run.world.prefix_caching
                      and len(self.run.prompts.seen) - self.run.prompts.seen_at_reset >= 2)
        @rule(drain=st.booleans())
        def reset_prefix_cache(self, drain: bool) -> None:
            """reset_prefix_cache, refused while any block is in use; `drain` finishes
            every request first, so that it can be done. Offered only once two requests
            came since the last reset: a reset drops every key that later prompts
            could hit."""
            if drain:
                for rid in sorted(self.run.requests):
                    self.apply(op="finish", request=rid, clear=False)
            self.apply(op="reset")

        @rule(query=strategies.step_queries(), pad=st.integers(0, 3))
        def step(self, query: list[int], pad: int) -> None:
            self.apply(op="step", query=query, pad=pad)

        @precondition(lambda self: self.run.growable())
        @rule(pad=st.integers(0, 1), iterations=st.integers(1, 8))
        def decode(self, pad: int, iterations: int) -> None:
            """Every running request computes one token (copy-on-write after forks), for
            a few engine iterations in a row, as a serving engine mostly does: each one
            a separate step, compared after it like any other."""
            for _ in range(iterations):
                self.apply(op="step", query=[1] * self.run.world.max_num_reqs, pad=pad)

        @precondition(lambda self: self.run.live())
        @rule(which=WHICH, length=strategies.prefill_lengths())
        def prefill(self, which: int, length: int) -> None:
            """One request computes a long chunk while the others decode (a mixed
            batch, as chunked prefill makes)."""
            live = self.run.live()
            row = self.run.requests[live[which % len(live)]].row
            query = [1] * self.run.world.max_num_reqs
            query[row] = length
            self.apply(op="step", query=query, pad=0)

        def _forkable(self) -> list[int]:
            run = self.run
            return [rid for rid in run.live() if run.requests[rid].written == run.slots(rid)]

        @precondition(lambda self: self.run.free_row() is not None and self._forkable())
        @rule(which=WHICH)
        def fork(self, which: int) -> None:
            parents = self._forkable()
            self.apply(op="fork", parent=parents[which % len(parents)])

        @precondition(lambda self: self.run.free_row() is not None and self._forkable())
        @rule(which=WHICH)
        def beam(self, which: int) -> None:
            """Beam search: fork, then every running request decodes one token, so a
            shared, partly filled last block is copied on write."""
            parents = self._forkable()
            self.apply(op="fork", parent=parents[which % len(parents)])
            self.apply(op="step", query=[1] * self.run.world.max_num_reqs, pad=0)

        @precondition(lambda self: self.run.requests)
        @rule(which=WHICH, clear=st.booleans())
        def finish(self, which: int, clear: bool) -> None:
            ids = sorted(self.run.requests)
            self.apply(op="finish", request=ids[which % len(ids)], clear=clear)

        @precondition(lambda self: self.run.live())
        @rule(which=WHICH)
        def preempt(self, which: int) -> None:
            live = self.run.live()
            self.apply(op="preempt", request=live[which % len(live)])

        @precondition(lambda self: self.run.preempted() and self.run.free_row() is not None)
        @rule(which=WHICH)
        def resume(self, which: int) -> None:
            waiting = self.run.preempted()
            self.apply(op="resume", request=waiting[which % len(waiting)])

        @rule(src=WHICH, hole=WHICH)
        def move(self, src: int, hole: int) -> None:
            """Move a row into a hole; the last choice is the row itself (a self-move)."""
            rows = self.run.world.max_num_reqs
            src %= rows
            holes = [r for r, rid in enumerate(self.run.rows) if rid is None and r != src] + [src]
            self.apply(op="move", src=src, dst=holes[hole % len(holes)])

        @rule(a=WHICH, b=WHICH)
        def swap(self, a: int, b: int) -> None:
            rows = self.run.world.max_num_reqs
            self.apply(op="swap", a=a % rows, b=b % rows)

        @precondition(lambda self: self.run.condensable())
        @rule()
        def condense(self) -> None:
            self.apply(op="condense")

        @rule(kind=st.sampled_from(REJECTION_KINDS), which=WHICH)
        def reject(self, kind: str, which: int) -> None:
            self.apply(op="reject", kind=kind, which=which)

    return LockstepMachine
