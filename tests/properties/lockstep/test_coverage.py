"""The quality tier: the generators reach the states that matter. A strategy change
that silently stops reaching one of them fails here."""

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from blocktable.plugin import KV_KINDS, V2_KINDS
from blocktable.properties.lockstep import events, strategies
from blocktable.properties.lockstep.events import LABELS
from blocktable.properties.lockstep.machine import make_machine
from blocktable.properties.run.prepare import plugins_for

pytestmark = pytest.mark.quality

# The bound: seeded chunks of 40 examples each, as `blocktable fuzz` runs them
# (fresh runs reach further than one long run, whose later examples are mostly
# mutations of earlier ones). First chunks of worlds of two or more groups admitting
# with fresh blocks, for the rarest label: an admission whose first group's fresh
# blocks, taken group by group, would evict a later group's hit (a conversation's next
# turn after other requests finished, in a pool nearly full). Then chunks of every
# kind of world, where the rarest is "row filled to its width": a row is 128 tokens or
# more wide and must be filled exactly, which the full-rows worlds (one in six) exist
# for. Then chunks of prefix-caching worlds alone (one world in three otherwise), where
# a rare label is "fresh admission fits only because hits are in use": a live
# request's cached blocks hit by another's admission in a pool nearly full.
PER_CHUNK = 40


def _tiers():
    """(chunks, worlds or None for every kind, KV worlds on, the labels it is for) of
    each tier, in order. The admissions across groups need no KV caches: off there,
    they cost less (a seed draws the same worlds with BLOCKTABLE_KV_WORLDS=0)."""
    return [
        (8, strategies.worlds().filter(
            lambda world: world.prefix_caching and world.fresh_admission and len(world.groups) > 1), False,
         [events.FRESH_EVICTS_OTHER_GROUP]),
        (10, None, True, LABELS),
        (5, strategies.worlds().filter(lambda world: world.prefix_caching), True, LABELS),
    ]


# The KV and V2 kernels beside it are our torch-native ones on every backend (the
# interpreter's default already): on an H200 the Triton ones compiled 96 variants for
# the worlds drawn here, about half of this test's time, and they are checked in
# lockstep elsewhere.
TORCH_KV = dict.fromkeys(KV_KINDS, "torch")
TORCH_V2 = dict.fromkeys(V2_KINDS, "torch")


def test_every_label_is_reached_within_the_bound(backend, monkeypatch):
    """Reach is a property of the generators, not of the kernels: the reference
    stands in for the slot mapping, so that the bound can be generous and the test
    cheap. The chunks of a tier are seeded 1000, 1001, ... and run in order until the
    labels the tier is for are reached: the set reached only grows, so the chunks
    after that could not change the verdict (the seeded draws reach them all in six
    chunks of twenty-three)."""
    runs = []

    def missing(labels):
        return [label for label in labels if label not in {seen for run in runs for seen in run.events}]

    for chunks, worlds, kv, aims in _tiers():
        monkeypatch.setenv(strategies.KV_WORLDS_VARIABLE, "1" if kv else "0")
        for chunk in range(chunks):
            if not missing(aims):
                break
            machine = make_machine(plugins_for("reference", TORCH_KV, backend, v2=TORCH_V2), backend, worlds=worlds,
                                   on_run=runs.append)
            seed(1000 + chunk)(machine)
            run_state_machine_as_test(machine, settings=settings(max_examples=PER_CHUNK, stateful_step_count=40,
                                                                 deadline=None, database=None,
                                                                 suppress_health_check=[HealthCheck.filter_too_much]))
    assert not missing(LABELS), f"not reached in {len(runs)} examples: {missing(LABELS)}"
