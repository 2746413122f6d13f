"""lockstep/warm makes every variant of our kernels that a lockstep run asks for: a
seeded run, with every kernel ours and in Triton (the slot-mapping kernel, the data
oracle, the V2 tables, the KV kernels), launches no variant that the warm calls did
not launch. A variant is told apart as Triton tells it: the compile-time constants,
the warps, each tensor's dtype, and each other argument as the kernel declares it (an
integer's type, from its annotation or its value; whether it is 1 or a multiple of 16,
and a pointer's 16-byte alignment, unless the kernel leaves them unspecialized)."""

import inspect

import pytest
import torch
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

import blocktable.kernels.kv as kv_kernels
import blocktable.kernels.oracle as oracle_kernels
import blocktable.kernels.slot_mapping as slot_kernels
import blocktable.kernels.v2 as v2_kernels
from blocktable import device, kv, oracle, plugin, slot
from blocktable.properties.lockstep import strategies
from blocktable.properties.lockstep.machine import make_machine
from blocktable.properties.lockstep.warm import kv as warm_kv
from blocktable.properties.lockstep.warm import oracle as warm_oracle
from blocktable.properties.lockstep.warm import slot as warm_slot
from blocktable.properties.lockstep.warm import warm_calls
from blocktable.properties.run.prepare import KV_KERNELS_VARIABLE, V2_KERNELS_VARIABLE, plugins_for
from blocktable.properties.slot.call import run_slot_call
from blocktable.properties.slot.examples import SPEC_EXAMPLES

LAUNCHED = {  # the kernels our wrappers launch, by module
    slot_kernels: ["slot_mapping_tiled"],
    oracle_kernels: ["write_values", "copy_blocks", "gather"],
    v2_kernels: ["append_block_ids", "gather_block_tables", "compute_slot_mappings"],
    kv_kernels: ["write_tokens", "write_tokens_unaligned", "copy_blocks", "copy_blocks_unaligned", "gather_tokens",
                 "gather_tokens_unaligned"],
}


def declared(jitted):
    """{parameter: (left unspecialized, alignment left unspecialized)} as the kernel
    was declared: a GPU build's parameters, or the interpreter's jit arguments."""
    if hasattr(jitted, "params"):
        return {p.name: (bool(p.do_not_specialize), bool(p.do_not_specialize_on_alignment)) for p in jitted.params}
    names = list(inspect.signature(jitted.fn).parameters)

    def named(key):
        return {names[v] if isinstance(v, int) else v for v in jitted.kwargs.get(key) or []}

    plain, unaligned = named("do_not_specialize"), named("do_not_specialize_on_alignment")
    return {name: (name in plain, name in unaligned) for name in names}


def variant(name, jitted, args, kwargs):
    params = inspect.signature(jitted.fn).parameters
    given = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k in params}
    flags = declared(jitted)
    key = [name, kwargs.get("num_warps"), kwargs.get("num_stages")]
    for p, parameter in params.items():
        value, annotation = given[p], parameter.annotation
        plain, unaligned = flags[p]
        if "constexpr" in str(annotation):
            key.append((p, value))
        elif isinstance(value, torch.Tensor):
            key.append((p, str(value.dtype), None if unaligned else value.data_ptr() % 16 == 0))
        elif isinstance(value, bool):
            key.append((p, "bool", value))
        elif isinstance(value, int):
            width = str(annotation) if annotation is not inspect.Parameter.empty else \
                "i32" if -2**31 <= value < 2**31 else "i64"
            key.append((p, width, None if plain else (value == 1, value % 16 == 0)))
        else:
            key.append((p, type(value).__name__))
    return tuple(key)


class Recorder:
    """A jitted kernel that records each launch's variant, and launches it while
    `launching[0]` (the warm side only records: on a GPU its variants would
    otherwise all be compiled here)."""

    def __init__(self, name, jitted, seen, launching):
        self.name, self.jitted, self.seen, self.launching = name, jitted, seen, launching
        self.fn = getattr(jitted, "fn", jitted)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.add(variant(self.name, self.jitted, args, kwargs))
            if self.launching[0]:
                self.jitted[grid](*args, **kwargs)
        return launch


@pytest.fixture
def recorded(monkeypatch):
    """The variants launched by our jitted kernels from here on, with the tiles a GPU
    would launch (under the interpreter too, where the tiles are chosen for numpy and
    nothing is compiled), and every kernel ours in Triton (the oracle included, which
    is torch under the interpreter by default)."""
    gpu = device.Backend("cuda", torch.device("cpu"))
    for module, name in ((kv, "launch_tiles"), (kv, "launch_rows"), (slot, "tiled_launch")):
        choose = getattr(module, name)
        monkeypatch.setattr(module, name, lambda backend, *sizes, choose=choose: choose(gpu, *sizes))
    monkeypatch.setattr(oracle, "_tile", lambda backend: oracle.GPU_TILE)
    monkeypatch.setenv("BLOCKTABLE_ORACLE", "triton")
    monkeypatch.setenv(KV_KERNELS_VARIABLE, "triton")
    monkeypatch.setenv(V2_KERNELS_VARIABLE, "triton")
    seen, launching = set(), [True]
    for module, names in LAUNCHED.items():
        for name in names:
            label = f"{module.__name__.rsplit('.', 1)[1]}.{name}"
            monkeypatch.setattr(module, name, Recorder(label, getattr(module, name), seen, launching))
    return seen, launching


def ours():
    return plugin.load_kv_kernels(dict.fromkeys(plugin.KV_KINDS, "triton"))


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


def warmed_variants(backend, recorded):
    seen, launching = recorded
    launching[0] = False
    kernels = ours()
    for call in warm_calls():
        for _ in call.launches(kernels, backend):
            pass
    warmed = set(seen)
    seen.clear()
    launching[0] = True
    return warmed


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
                                                                                   recorded):
    warmed = warmed_variants(backend, recorded)
    assert sum(name.startswith("kv.") for name, *_ in warmed) == 180  # 75 writes, 15 copies, 90 gathers
    monkeypatch.setenv(strategies.KV_WORLDS_VARIABLE, "1")
    run(backend, strategies.worlds().filter(lambda world: world.kv is not None), 24, 7)
    launched = {v for v in recorded[0] if v[0].startswith("kv.")}
    assert len(launched) >= 10  # the run launched the KV kernels in several kinds of world
    missing = launched - warmed
    assert not missing, f"{len(missing)} of {len(launched)} variants not warmed, first: {sorted(missing)[0]}"


@pytest.mark.fuzz
@pytest.mark.loops  # the oracle's copy and the V2 kernels, in Triton under the interpreter too
def test_a_seeded_run_of_the_default_mix_asks_for_no_variant_the_warm_calls_do_not_make(backend, recorded):
    warmed = warmed_variants(backend, recorded)
    run_examples(backend)
    run(backend, strategies.worlds(), 60, 1)
    launched = set(recorded[0])
    families = {name.split(".")[0] for name, *_ in launched}
    assert families == {"slot_mapping", "oracle", "v2", "kv"}, families  # every family was launched
    missing = launched - warmed
    assert not missing, f"{len(missing)} of {len(launched)} variants not warmed, first: {sorted(missing)[0]}"
