"""lockstep/warm.py makes every KV kernel variant that the lockstep's worlds ask for:
a seeded run of KV worlds, with our Triton kernels, launches no variant that the warm
calls did not launch. A variant is told apart as Triton tells it: the compile-time
constants, the warps, each tensor's dtype, and the arguments Triton specializes (an
integer equal to 1 or a multiple of 16, a pointer's 16-byte alignment), except those
the kernel's jit leaves unspecialized."""

import inspect

import pytest
import torch
from hypothesis import HealthCheck, seed, settings
from hypothesis.stateful import run_state_machine_as_test

import blocktable.kernels.kv as kernels
from blocktable import device, kv, plugin
from blocktable.properties.lockstep import strategies
from blocktable.properties.lockstep.machine import make_machine
from blocktable.properties.lockstep.warm import launches, request_counts, warm_calls
from blocktable.properties.run.prepare import plugins_for

# name: (python function, integers left unspecialized, pointers left unaligned)
KERNELS = {
    "write_tokens": (kernels.WRITE_INTEGERS, []),
    "write_tokens_unaligned": (kernels.WRITE_INTEGERS, kernels.WRITE_DATA_POINTERS),
    "copy_blocks": (kernels.COPY_INTEGERS, []),
    "copy_blocks_unaligned": (kernels.COPY_INTEGERS, kernels.COPY_DATA_POINTERS),
    "gather_tokens": (kernels.GATHER_INTEGERS, []),
    "gather_tokens_unaligned": (kernels.GATHER_INTEGERS, kernels.GATHER_DATA_POINTERS),
}


def variant(name, fn, args, kwargs):
    integers, unaligned = KERNELS[name]
    params = inspect.signature(fn).parameters
    given = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k in params}
    key = [name, kwargs.get("num_warps"), kwargs.get("num_stages")]
    for p, parameter in params.items():
        value = given[p]
        if "constexpr" in str(parameter.annotation):
            key.append((p, value))
        elif isinstance(value, torch.Tensor):
            key.append((p, str(value.dtype), None if p in unaligned else value.data_ptr() % 16 == 0))
        elif isinstance(value, bool):
            key.append((p, "bool", value))
        elif isinstance(value, int):
            width = "i32" if -2**31 <= value < 2**31 else "i64"
            key.append((p, width, None if p in integers else (value == 1, value % 16 == 0)))
        else:
            key.append((p, type(value).__name__))
    return tuple(key)


class Recorder:
    """A jitted kernel that records each launch's variant, and launches it while
    `launching[0]` (the warm side only records: on a GPU its 180 variants would
    otherwise be compiled here)."""

    def __init__(self, name, jitted, seen, launching):
        self.name, self.jitted, self.seen, self.launching = name, jitted, seen, launching
        self.fn = getattr(jitted, "fn", jitted)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.add(variant(self.name, self.fn, args, kwargs))
            if self.launching[0]:
                self.jitted[grid](*args, **kwargs)
        return launch


@pytest.fixture
def recorded(monkeypatch):
    """The variants launched, by the six jitted KV kernels, from here on, with the
    tiles a GPU would launch (under the interpreter too, where the tiles are chosen
    for numpy and nothing is compiled)."""
    gpu = device.Backend("cuda", torch.device("cpu"))
    for name in ("launch_tiles", "launch_rows"):
        choose = getattr(kv, name)
        monkeypatch.setattr(kv, name, lambda backend, *sizes, choose=choose: choose(gpu, *sizes))
    seen, launching = set(), [True]
    for name in KERNELS:
        monkeypatch.setattr(kernels, name, Recorder(name, getattr(kernels, name), seen, launching))
    return seen, launching


def ours(backend):
    return plugin.load_kv_kernels(dict.fromkeys(plugin.KV_KINDS, "triton"))


def test_the_warm_calls_cover_every_kind_of_world():
    calls = warm_calls()
    kinds = {(c.kv.num_heads, c.kv.head_size, c.kv.dtype, c.kv.kv_cache_dtype) for c in calls}
    assert len(kinds) == len(calls) == 3 * 5 * 3 * 2
    fp8 = [c for c in calls if c.kv.kv_cache_dtype == "fp8_e4m3"]
    assert all(set(c.scales) == set(strategies.KV_SCALES) for c in fp8)
    # 8 ranks of 6 requests: up to 48 request slots, so 4 and 8 search steps.
    assert request_counts() == (16, 48)


@pytest.mark.fuzz
def test_a_seeded_run_asks_for_no_variant_the_warm_calls_do_not_make(backend, monkeypatch, recorded):
    recorded, launching = recorded
    launching[0] = False
    kernels_ = ours(backend)
    for call in warm_calls():
        for _ in launches(call, kernels_, backend):
            pass
    warmed = set(recorded)
    assert len(warmed) == 180  # 75 writes, 15 copies, 90 gathers (test_the_warm_calls_cover_every_kind_of_world)
    recorded.clear()
    launching[0] = True
    monkeypatch.setenv(strategies.KV_WORLDS_VARIABLE, "1")
    triton = dict.fromkeys(plugin.KV_KINDS, "triton")
    machine = make_machine(plugins_for("reference", triton, backend, v2=dict.fromkeys(plugin.V2_KINDS, "torch")),
                           backend, worlds=strategies.worlds().filter(lambda world: world.kv is not None))
    seed(7)(machine)
    run_state_machine_as_test(machine, settings=settings(max_examples=24, stateful_step_count=6, deadline=None,
                                                         database=None,
                                                         suppress_health_check=[HealthCheck.filter_too_much]))
    assert len(recorded) >= 10  # the run launched the kernels in several kinds of world
    missing = recorded - warmed
    assert not missing, f"{len(missing)} of {len(recorded)} variants not warmed, first: {sorted(missing)[0]}"
