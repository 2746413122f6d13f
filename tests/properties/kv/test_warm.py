"""kv/warm makes every variant of our KV kernels that the stateless KV modes' draws ask
for: seeded draws of each kind, sized as on a GPU, launch no variant (as Triton tells
them apart: tests/properties/conftest.py) that the warm calls did not launch; and
every warm call passes on our kernels."""

import numpy as np
import pytest

from blocktable import plugin
from blocktable.properties.kv import warm
from blocktable.properties.kv.call import run_kv_call
from blocktable.properties.kv.draw import HEAD_SIZES, draw

GPU_SIZES = (1 << 20, 1 << 14)  # max_elements, max_tokens: a stateless run's on a GPU (run/stateless.py)


def ours():
    return plugin.load_kv_kernels(dict.fromkeys(plugin.KV_KINDS, "triton"))


def recorded_without_launching(recorded, calls, backend):
    """The variants `calls` launch, each only recorded (so the call itself fails its
    comparison, which is not what this looks at)."""
    seen, launching = recorded
    launching[0] = False
    kernels = ours()
    for call in calls:
        run_kv_call(call, getattr(kernels, call["op"]), backend.device)
    made = set(seen)
    seen.clear()
    launching[0] = True
    return made


def test_one_call_per_head_count_and_head_size_the_draws_take():
    calls = warm.calls()
    assert {(c.heads, c.head_size) for c in calls} == {(H, D) for H in range(1, 5) for D in HEAD_SIZES}
    assert len(calls) == 4 * len(HEAD_SIZES)
    assert len({c.describe() for c in calls}) == len(calls)  # a foreground warm names each
    assert calls[0].head_size in (64, 128)


@pytest.mark.parametrize("op", ["write", "copy", "gather"])
def test_seeded_draws_ask_for_no_variant_the_warm_calls_do_not_make(backend, recorded, op):
    warmed = recorded_without_launching(recorded, [c for w in warm.calls() for c in w.calls()], backend)
    rng = np.random.default_rng(11)
    launched = recorded_without_launching(recorded, [draw(op, rng, *GPU_SIZES) for _ in range(150)], backend)
    assert len(launched) >= 30  # the draws met many variants
    missing = launched - warmed
    assert not missing, f"{len(missing)} of {len(launched)} variants not warmed, first: {sorted(missing)[0]}"


@pytest.mark.interpreter
@pytest.mark.parametrize("index", range(4 * len(HEAD_SIZES)))
def test_the_warm_calls_pass_on_our_kernels(backend, index):
    call = warm.calls()[index]
    made = list(call.launches(ours(), backend))  # each raises if our kernels get its tiny call wrong
    assert len(made) == len(list(call.calls())) > 0
