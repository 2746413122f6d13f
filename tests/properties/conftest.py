"""What the warm tests share: recording each variant our jitted kernels are launched
with, as Triton tells variants apart (tests/properties/lockstep/test_warm.py and
tests/properties/kv/test_warm.py)."""

import inspect

import pytest
import torch

import blocktable.kernels.kv as kv_kernels
import blocktable.kernels.oracle as oracle_kernels
import blocktable.kernels.slot_mapping as slot_kernels
import blocktable.kernels.v2 as v2_kernels
from blocktable import device, kv, oracle, plugin, slot
from blocktable.properties.run.prepare import KV_KERNELS_VARIABLE, V2_KERNELS_VARIABLE

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


class Recording:
    """The variants launched so far (`seen`), and a way to record some without
    launching them."""

    def __init__(self):
        self.seen, self.launching = set(), [True]

    def only_recording(self, run):
        """The variants `run()` launches, recorded but not launched (on a GPU they
        would otherwise all be compiled here), and taken out of `seen`."""
        self.launching[0] = False
        try:
            run()
        finally:
            self.launching[0] = True
        made = set(self.seen)
        self.seen.clear()
        return made


@pytest.fixture
def our_kv_kernels():
    return plugin.load_kv_kernels(dict.fromkeys(plugin.KV_KINDS, "triton"))


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
    recording = Recording()
    for module, names in LAUNCHED.items():
        for name in names:
            label = f"{module.__name__.rsplit('.', 1)[1]}.{name}"
            monkeypatch.setattr(module, name, Recorder(label, getattr(module, name), recording.seen,
                                                       recording.launching))
    return recording
