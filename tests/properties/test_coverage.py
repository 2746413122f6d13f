"""The quality tier: the generators reach the states that matter. A strategy change
that silently stops reaching one of them fails here."""

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from blocktable import plugin
from blocktable.properties.machine import make_machine
from blocktable.properties.reference_kernel import harness_kernels

pytestmark = pytest.mark.quality

LABELS = ["fork depth >= 2", "copy-on-write", "ref >= 3", "row reused shorter", "self-move", "self-swap",
          "tile crossing", "non-local DCP tokens", "pool exhausted", "resumed (recompute)", "cuda-graph padding",
          "ids offset toward 2**31-1", "finished row left stale", "rejected row-overflow", "rejected double-free",
          "rejected free-duplicate", "rejected over-allocate", "rejected fork-unknown",
          "row filled to its width"]
# The bound. Measured: every label by about 30 examples; the margin absorbs the
# variation in what Hypothesis generates (it differs with what ran earlier in the
# same process, so this test must not sit on the edge).
EXAMPLES = 200


def test_every_label_is_reached_within_the_bound(backend):
    """Reach is a property of the generators, not of the kernel: the reference
    stands in for it, so that the bound can be generous and the test cheap."""
    runs = []
    machine = make_machine(plugin.load("reference", harness_kernels()), backend, on_run=runs.append)
    run_state_machine_as_test(machine, settings=settings(max_examples=EXAMPLES, stateful_step_count=40,
                                                         deadline=None, database=None, derandomize=True))
    reached = {label for run in runs for label in run.events}
    missing = [label for label in LABELS if label not in reached]
    assert not missing, f"not reached in {EXAMPLES} examples: {missing}"
