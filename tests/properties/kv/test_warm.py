"""kv/warm makes every variant of our KV kernels that the stateless KV modes' draws ask
for: seeded draws of each kind and the smaller calls they shrink to launch no variant
(as Triton tells them apart: tests/properties/conftest.py) that the warm calls did
not launch; what the warm takes as constant over the draws is; and every warm call
passes on our kernels."""

import math

import numpy as np
import pytest

from blocktable.kv import FAST_DIVISION_SCALES
from blocktable.properties.kv import draw as kv_draw
from blocktable.properties.kv import warm
from blocktable.properties.kv.call import run_kv_call
from blocktable.properties.run.stateless import kv_call_sizes

# The draws' variants do not depend on how large a call is (kv/warm.py), so the
# coverage test draws small calls, many of them.
SMALL = (1 << 12, 1 << 8)


def recorded_without_launching(recorded, calls, backend, kernels):
    """The variants `calls` launch, each only recorded (so the call itself fails its
    comparison, which is not what this looks at)."""
    return recorded.only_recording(lambda: [run_kv_call(call, getattr(kernels, call["op"]), backend.device)
                                            for call in calls])


def test_one_call_per_head_count_and_head_size_the_draws_take():
    calls = warm.calls()
    assert {(c.heads, c.head_size) for c in calls} == {(H, D) for H in range(1, kv_draw.MAX_HEADS + 1)
                                                       for D in kv_draw.HEAD_SIZES}
    assert len({c.describe() for c in calls}) == len(calls)  # a foreground warm names each
    assert calls[0].head_size in (64, 128)
    tiny = [c for w in calls for c in w.calls()]
    assert len(tiny) == 752  # one per variant: 320 writes, 384 gathers, 48 copies
    assert sorted(c["op"] for c in tiny).count("copy") == 48


@pytest.mark.parametrize("op", ["write", "copy", "gather"])
def test_seeded_draws_and_their_shrinks_ask_for_no_variant_the_warm_calls_do_not_make(backend, recorded, op,
                                                                                       our_kv_kernels):
    warmed = recorded_without_launching(recorded, [c for w in warm.calls() for c in w.calls()], backend,
                                        our_kv_kernels)
    rng = np.random.default_rng(11)
    drawn = [kv_draw.draw(op, rng, *SMALL) for _ in range(1000)]
    shrunk = [part for call in drawn[:100] for part in kv_draw.candidates(call, None)[:-1]]
    launched = recorded_without_launching(recorded, drawn + shrunk, backend, our_kv_kernels)
    made = {v for v in warmed if op in v[0]}
    assert len(launched) >= len(made) * 3 // 4  # the draws met most of the warm's variants of this kernel
    missing = launched - warmed
    assert not missing, f"{len(missing)} of {len(launched)} variants not warmed, first: {sorted(missing)[0]}"


def test_every_scale_drawn_takes_the_fast_division_and_every_cache_slot_fits_in_int32():
    """What the warm takes as constant: the write's EXACT_DIVISION (false) and
    SLOTS_INT32 (true), on a GPU's and the interpreter's sizes."""
    low, high = FAST_DIVISION_SCALES
    assert all(low <= s <= high for s in kv_draw.SCALES)
    assert low <= math.exp(-6) and math.exp(6) <= high  # _scale's other draws: exp(uniform(-6, 6))
    rng = np.random.default_rng(3)
    for interpreted in (False, True):
        max_elements, max_tokens = kv_call_sizes(interpreted)
        assert max_elements <= 2**31
        for _ in range(200):
            call = kv_draw.draw("write", rng, max_elements, max_tokens)
            assert low <= call["k_scale"] <= high and low <= call["v_scale"] <= high
            assert call["num_blocks"] * call["block_size"] <= 2**31


@pytest.mark.interpreter
@pytest.mark.parametrize("index", range(kv_draw.MAX_HEADS * len(kv_draw.HEAD_SIZES)))
def test_the_warm_calls_pass_on_our_kernels(backend, index, our_kv_kernels):
    call = warm.calls()[index]
    made = list(call.launches(our_kv_kernels, backend))  # each raises if our kernels get its tiny call wrong
    assert len(made) == len(list(call.calls())) > 0
