"""The quality tier: the generators reach the states that matter. A strategy change
that silently stops reaching one of them fails here."""

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from blocktable.properties.lockstep import strategies
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
CHUNKS, PREFIX_CHUNKS, GROUPS_CHUNKS, PER_CHUNK = 10, 5, 8, 40


def _chunk_worlds(chunk: int):
    """The worlds of one chunk: §8's admissions across groups, then every kind, then prefix caching."""
    if chunk < GROUPS_CHUNKS:
        return strategies.worlds().filter(
            lambda world: world.prefix_caching and world.fresh_admission and len(world.groups) > 1)
    if chunk < GROUPS_CHUNKS + CHUNKS:
        return None
    return strategies.worlds().filter(lambda world: world.prefix_caching)


def test_every_label_is_reached_within_the_bound(backend):
    """Reach is a property of the generators, not of the kernel: the reference
    stands in for it, so that the bound can be generous and the test cheap. The
    chunks run in order until every label is reached: the set reached only grows,
    so the chunks after that could not change the verdict (the seeded draws reach
    them all by the thirteenth chunk of twenty-three)."""
    runs = []
    for chunk in range(CHUNKS + PREFIX_CHUNKS + GROUPS_CHUNKS):
        if not [label for label in LABELS if label not in {seen for run in runs for seen in run.events}]:
            break
        machine = make_machine(plugins_for("reference", {}, backend), backend,
                               worlds=_chunk_worlds(chunk), on_run=runs.append)
        seed(1000 + chunk)(machine)
        run_state_machine_as_test(machine, settings=settings(max_examples=PER_CHUNK, stateful_step_count=40,
                                                             deadline=None, database=None,
                                                             suppress_health_check=[HealthCheck.filter_too_much]))
    reached = {label for run in runs for label in run.events}
    missing = [label for label in LABELS if label not in reached]
    assert not missing, f"not reached in {len(runs)} examples: {missing}"
