"""lockstep/warm makes every variant of our kernels that a lockstep run asks for: a
seeded run, with every kernel ours and in Triton (the slot-mapping kernel, the data
oracle, the V2 tables, the KV kernels), launches no variant that the warm calls did
not launch. A variant is told apart as Triton tells it: the compile-time constants,
the warps, each tensor's dtype, and each other argument as the kernel declares it (an
integer's type, from its annotation or its value; whether it is 1 or a multiple of 16,
and a pointer's 16-byte alignment, unless the kernel leaves them unspecialized)."""


import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from blocktable import oracle, plugin, slot
from blocktable.properties.lockstep import strategies
from blocktable.properties.lockstep.machine import make_machine
from blocktable.properties.lockstep.warm import kv as warm_kv
from blocktable.properties.lockstep.warm import oracle as warm_oracle
from blocktable.properties.lockstep.warm import slot as warm_slot
from blocktable.properties.lockstep.warm import warm_calls
from blocktable.properties.run.prepare import plugins_for
from blocktable.properties.slot.call import run_slot_call
from blocktable.properties.slot.examples import SPEC_EXAMPLES


def test_the_kv_calls_cover_every_kind_of_world():
    calls = warm_kv.calls()
    kinds = {(c.kv.num_heads, c.kv.head_size, c.kv.dtype, c.kv.kv_cache_dtype) for c in calls}
    assert len(kinds) == len(calls) == 3 * 5 * 3 * 2
    fp8 = [c for c in calls if c.kv.kv_cache_dtype == "fp8_e4m3"]
    assert all(set(c.scales) == set(strategies.KV_SCALES) for c in fp8)
    # 8 ranks of 6 requests: up to 48 request slots, so 4 and 8 search steps.
    assert warm_kv.request_counts() == (16, 48)


def test_the_slot_calls_take_every_search_step_count_and_the_oracle_every_copy_tile():
    assert [warm_slot.requests(s) for s in range(4)] == [1, 2, 3, 5]
    assert [max(0, warm_slot.requests(s) - 1).bit_length() for s in range(4)] == [0, 1, 2, 3]
    # The kernel's search steps for every request count a lockstep call can have (blocktable/slot.py).
    reachable = {max(0, n - 1).bit_length() for n in range(strategies.MAX_NUM_REQS + 1)}
    assert {c.steps for c in warm_slot.calls() if isinstance(c, warm_slot.SlotCall)} == reachable
    copies = sorted(c.block_slots for c in warm_oracle.calls() if c.block_slots is not None)
    assert copies == [1 << k for k in range(11)] and copies[-1] == oracle.GPU_TILE


def test_the_calls_run_first_those_a_run_needs_from_its_first_step():
    calls = warm_calls()
    assert [type(c).__name__ for c in calls[:2]] == ["ExamplesCall", "SlotCall"]
    assert type(calls[-1]).__name__ == "KVCall"
    assert len({c.describe() for c in calls}) == len(calls)  # a foreground warm names each


def warmed_variants(backend, recorded, kernels):
    def warm():
        for call in warm_calls():
            for _ in call.launches(kernels, backend):
                pass
    return recorded.only_recording(warm)


def run_examples(backend):
    """The contract's worked examples through our kernel, as a fuzzing run checks them first."""
    for example in SPEC_EXAMPLES:
        outcome = run_slot_call(example.call(), slot.slot_mapping_tiled, backend)
        assert outcome.passed, example.name


def run(backend, worlds, examples, seed_):
    triton = dict.fromkeys(plugin.KV_KINDS, "triton")
    machine = make_machine(plugins_for("triton", triton, backend, v2=dict.fromkeys(plugin.V2_KINDS, "triton")),
                           backend, worlds=worlds)
    seed(seed_)(machine)
    run_state_machine_as_test(machine, settings=settings(max_examples=examples, stateful_step_count=6, deadline=None,
                                                         database=None,
                                                         suppress_health_check=[HealthCheck.filter_too_much]))


@pytest.mark.fuzz
@pytest.mark.loops  # the oracle's copy and the V2 kernels, in Triton under the interpreter too
def test_a_seeded_run_of_kv_worlds_asks_for_no_variant_the_warm_calls_do_not_make(backend, monkeypatch,
                                                                                   recorded, our_kv_kernels):
    warmed = warmed_variants(backend, recorded, our_kv_kernels)
    assert sum(name.startswith("kv.") for name, *_ in warmed) == 180  # 75 writes, 15 copies, 90 gathers
    monkeypatch.setenv(strategies.KV_WORLDS_VARIABLE, "1")
    run(backend, strategies.worlds().filter(lambda world: world.kv is not None), 24, 7)
    launched = {v for v in recorded.seen if v[0].startswith("kv.")}
    assert len(launched) >= 10  # the run launched the KV kernels in several kinds of world
    missing = launched - warmed
    assert not missing, f"{len(missing)} of {len(launched)} variants not warmed, first: {sorted(missing)[0]}"


@pytest.mark.fuzz
@pytest.mark.loops  # the oracle's copy and the V2 kernels, in Triton under the interpreter too
def test_a_seeded_run_of_the_default_mix_asks_for_no_variant_the_warm_calls_do_not_make(backend, recorded,
                                                                                         our_kv_kernels):
    warmed = warmed_variants(backend, recorded, our_kv_kernels)
    run_examples(backend)
    run(backend, strategies.worlds(), 60, 1)
    launched = set(recorded.seen)
    families = {name.split(".")[0] for name, *_ in launched}
    assert families == {"slot_mapping", "oracle", "v2", "kv"}, families  # every family was launched
    missing = launched - warmed
    assert not missing, f"{len(missing)} of {len(launched)} variants not warmed, first: {sorted(missing)[0]}"
