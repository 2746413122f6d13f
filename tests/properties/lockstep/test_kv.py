"""docs/contract.md §9 through the lockstep: worlds with KV caches pass with our kernels,
the torch-native ones and the example plug-ins, and a one-line bug in any of the
three kernels is found, with the differing element decoded."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from blocktable.properties.compare import Discrepancy
from blocktable.properties.kv.data import token_data
from blocktable.properties.lockstep.driver import Lockstep
from blocktable.properties.lockstep.kv import GUARD, cache_pair, flat_size, locate, scratch_pairs
from blocktable.properties.run.prepare import KV_KERNELS_VARIABLE, plugins_for
from blocktable.properties.world import GroupConfig, KVConfig, WorldConfig

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

# Two shapes of world: one plain group; DCP over two ranks with a hybrid sharded group
# (I = 8) and a replicated one.
GROUPS = {"plain": (1, (GroupConfig(16, 16),)),
          "dcp": (2, (GroupConfig(32, 16, True, 8), GroupConfig(8, 4, False)))}
KVS = {"f16-nhd": KVConfig(2, 4, "float16", "auto", "NHD", False, 0),
       "bf16-fp8-hnd-joint": KVConfig(1, 3, "bfloat16", "fp8_e4m3", "HND", True, 2, 0.37, 2.5),
       "f32-fp8-nhd-pad": KVConfig(3, 2, "float32", "fp8_e4m3", "NHD", False, 1, 1.0, 0.0173)}
# Add, compute 30 tokens, fork (the fork shares a partly filled block), both decode and
# prefill: copy-on-write, then more writes and gathers.
PROGRAM = [{"op": "add"}, {"op": "step", "query": [30]}, {"op": "fork", "parent": 0},
           {"op": "step", "query": [5, 5]}, {"op": "step", "query": [1, 40]}]


def world(shape: str, kv: str) -> WorldConfig:
    W, groups = GROUPS[shape]
    return WorldConfig(groups=groups, cp_world_size=W, num_blocks=20, max_num_reqs=3, max_model_len=200,
                       max_num_batched_tokens=40, kv=KVS[kv])


def run_program(w: WorldConfig, backend, strict_nan: bool = False, **kernels: str) -> Lockstep:
    run = Lockstep(w, plugins_for("triton", kernels, backend, strict_nan), backend)
    for step in PROGRAM:
        run.apply(step)
    return run


@pytest.mark.parametrize("shape", GROUPS)
@pytest.mark.parametrize("kv", KVS)
def test_our_kernels_pass(backend, monkeypatch, shape, kv):
    monkeypatch.setenv(KV_KERNELS_VARIABLE, "triton")  # ours under the interpreter too
    run = run_program(world(shape, kv), backend)
    assert run.kv.kernels.write.__module__ == "blocktable.kv"
    assert run.events["KV blocks copied on write"] and run.events["KV sequences gathered"]


@pytest.mark.parametrize("kernels", [
    {"write": "torch", "copy": "torch", "gather": "torch"},
    {"write": f"{EXAMPLES}/torch_kv_write.py:write", "copy": f"{EXAMPLES}/torch_kv_copy.py:copy_blocks",
     "gather": f"{EXAMPLES}/torch_kv_gather.py:gather"}], ids=["torch-native", "examples"])
@pytest.mark.parametrize("kv", ["f16-nhd", "bf16-fp8-hnd-joint"])
def test_other_correct_kernels_pass(backend, kernels, kv):
    run_program(world("dcp", kv), backend, **kernels)


EXAMPLE_KERNELS = {"write": f"{EXAMPLES}/torch_kv_write.py:write", "gather": f"{EXAMPLES}/torch_kv_gather.py:gather"}


def torch_keeps_a_nans_sign_in_fp8(backend) -> bool:
    """Whether torch on this device casts a negative NaN, divided by a scale as the
    example write divides it, to 0xFF (the CPU's cast) rather than the reference's
    0x7F (CUDA's cast gives 0x7F for every NaN)."""
    negative_nan = torch.tensor([-0x400000], dtype=torch.int32).view(torch.float32).to(backend.device)
    divisor = torch.tensor([0.5], dtype=torch.float32, device=backend.device)
    code = (negative_nan / divisor).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    return int(code.item()) == 0xFF


@pytest.mark.parametrize("kind", EXAMPLE_KERNELS)
def test_torchs_own_nan_encodings_pass_and_strict_nan_names_them(backend, kind):
    """The example write casts with torch (on the CPU a negative NaN is 0xFF, the
    reference's 0x7F); the example gather decodes with torch (a NaN keeps the code's
    payload). docs/contract.md §9 lets NaN encodings differ; --strict-nan holds them
    exact and says that is all that differs. Where torch's cast gives the reference's
    code (CUDA), nothing differs, and --strict-nan passes too."""
    w = world("dcp", "bf16-fp8-hnd-joint")
    run_program(w, backend, **{kind: EXAMPLE_KERNELS[kind]})
    if kind == "write" and not torch_keeps_a_nans_sign_in_fp8(backend):
        run_program(w, backend, strict_nan=True, **{kind: EXAMPLE_KERNELS[kind]})
        return
    with pytest.raises(Discrepancy, match="the difference is only a NaN encoding"):
        run_program(w, backend, strict_nan=True, **{kind: EXAMPLE_KERNELS[kind]})


def planted(tmp_path: Path, name: str, old: str, new: str) -> str:
    source = (EXAMPLES / name).read_text()
    assert source.count(old) == 1
    path = tmp_path / name
    path.write_text(source.replace(old, new))
    return str(path)


def test_a_write_through_slot_minus_one_is_found(backend, tmp_path):
    """vLLM #43810: a padded or non-local token's slot -1 lands in the last slot."""
    spec = planted(tmp_path, "torch_kv_write.py", "slot_mapping >= 0", "slot_mapping >= -1") + ":write"
    with pytest.raises(Discrepancy, match=r"group 0 KV cache: key cache, rank 1 block 39 offset 15 \(slot 639\) "
                                          r"head 0 dim 0, a slot this step does not write"):
        run_program(world("dcp", "f16-nhd"), backend, write=spec)


def test_a_partial_copy_is_found(backend, tmp_path):
    spec = planted(tmp_path, "torch_kv_copy.py", "bits[dst] = bits[src]", "bits[dst, :1] = bits[src, :1]")
    with pytest.raises(Discrepancy, match=r"KV cache: key cache, rank 0 block \d+ offset 1 .* in a block this step "
                                          r"copies from rank 0 block \d+"):
        run_program(world("plain", "f16-nhd"), backend, copy=spec + ":copy_blocks")


def test_a_gather_off_by_one_is_found(backend, tmp_path):
    spec = planted(tmp_path, "torch_kv_gather.py", "j % block_size", "(j + 1) % block_size") + ":gather"
    with pytest.raises(Discrepancy, match=r"group 0 KV gather: key row 0 \(request 0 rank 0 local index 0\) "
                                          r"head 0 dim 0"):
        run_program(world("dcp", "f16-nhd"), backend, gather=spec)


def test_a_write_before_the_cache_is_caught_by_its_guard(backend, tmp_path):
    path = tmp_path / "stray.py"
    path.write_text(
        "import torch\n"
        "from blocktable.kv import write as ours\n\n"
        "def write(key, value, key_cache, value_cache, slot_mapping, **kw):\n"
        "    ours(key, value, key_cache, value_cache, slot_mapping, **kw)\n"
        "    torch.as_strided(key_cache, (1,), (1,), key_cache.storage_offset() - 1).fill_(7)\n")
    with pytest.raises(Discrepancy, match=r"KV cache: the guard cells before the caches \(cell -1\)"):
        run_program(world("plain", "f16-nhd"), backend, write=f"{path}:write")


def test_a_kernel_that_raises_is_reported_after_the_slot_checks(backend, tmp_path):
    path = tmp_path / "raises.py"
    path.write_text("def gather(*args, **kwargs):\n    raise RuntimeError('no kernel image')\n")
    with pytest.raises(Discrepancy, match="the kv-gather kernel raised RuntimeError: no kernel image"):
        run_program(world("plain", "f16-nhd"), backend, gather=f"{path}:gather")


@pytest.mark.parametrize("kv", KVS)
def test_locate_names_every_cell(kv):
    """Every cell of a group's cache memory decodes to the element that is there (or
    to a guard or padding cell), and element (block, offset, head, dim) of either
    cache decodes back to itself."""
    cfg = KVS[kv]
    blocks, Bk = 6, 4
    flat = np.arange(flat_size(cfg, blocks, Bk), dtype=np.int64)  # each cell holds its own index
    pair = cache_pair(flat, cfg, blocks, Bk)
    for name, view in (("key", pair.key), ("value", pair.value)):
        for block, offset, head, dim in [(0, 0, 0, 0), (5, 3, cfg.num_heads - 1, cfg.head_size - 1), (2, 1, 0, 1 % cfg.head_size)]:
            cell = view[block, offset, head, dim] if cfg.layout == "NHD" else view[block, head, offset, dim]
            text, rank, slot = locate(pair, int(cell), cfg, Bk, blocks_per_rank=3)
            assert text == (f"{name} cache, rank {block // 3} block {block % 3} offset {offset} "
                            f"(slot {(block % 3) * Bk + offset}) head {head} dim {dim}")
            assert (rank, slot) == (block // 3, (block % 3) * Bk + offset)
    assert locate(pair, 0, cfg, Bk, 3)[0] == f"the guard cells before the caches (cell {-GUARD})"
    assert locate(pair, len(flat) - 1, cfg, Bk, 3)[0] == f"the guard cells after the caches (cell {GUARD - 1})"
    elements = {int(c) for v in (pair.key, pair.value) for c in v.reshape(-1)}
    assert len(elements) == 2 * blocks * Bk * cfg.num_heads * cfg.head_size  # no two elements share a cell
    for cell in range(GUARD, len(flat) - GUARD):
        text = locate(pair, cell, cfg, Bk, 3)[0]
        assert (cell in elements) == (text != "padding after a head's D (no cache element)")


def test_token_data_is_a_function_of_the_value():
    cfg = KVS["bf16-fp8-hnd-joint"]
    a = token_data(np.array([5, 9, 5]), cfg, 0)
    assert np.array_equal(a[0], a[2]) and not np.array_equal(a[0], a[1])
    assert not np.array_equal(a, token_data(np.array([5, 9, 5]), cfg, 1))  # keys differ from values


def test_under_the_interpreter_the_kv_worlds_default_to_torch_native(backend, monkeypatch):
    monkeypatch.delenv(KV_KERNELS_VARIABLE, raising=False)
    gather = f"{EXAMPLES}/torch_kv_gather.py:gather"
    picked = plugins_for("triton", {"gather": gather}, backend).kv
    ours = "torch" if backend.interpreted else "triton"
    assert picked.specs == {"write": ours, "copy": ours, "gather": gather}


def test_a_kv_world_round_trips_through_json():
    w = world("dcp", "bf16-fp8-hnd-joint")
    assert WorldConfig.from_json(w.to_json()) == w
    with pytest.raises(ValueError, match="cannot offset its table ids"):
        WorldConfig(id_offset=5, kv=KVConfig())


def scratch_pairs_block_by_block(ref: list[int], cached: list[list[int]], null_block: bool,
                                 cow: list[tuple[int, int]], k: int) -> list[tuple[int, int]]:
    """The scratch copies' rule, block by block: destinations are free blocks (ref 0,
    not the null block, not in any copy-on-write pair, holding no cached prefix),
    picked at k * 7 and k * 7 + 1 of them; sources are blocks in use that no pair
    writes (else free blocks other than the destinations), picked at k * 3 + i."""
    taken = {b for pair in cow for b in pair}
    free = [b for b in range(len(ref)) if ref[b] == 0 and b not in taken and not (null_block and b == 0)
            and not any(b in blocks for blocks in cached)]
    if not free:
        return []
    written = {d for _, d in cow}
    used = [b for b in range(len(ref)) if ref[b] > 0 and b not in written]
    dsts: list[int] = []
    for i in range(min(2, len(free))):
        if free[(k * 7 + i) % len(free)] not in dsts:
            dsts.append(free[(k * 7 + i) % len(free)])
    sources = used or [b for b in free if b not in dsts]
    return [(sources[(k * 3 + i) % len(sources)], d) for i, d in enumerate(dsts)] if sources else []


@given(data=st.data())
def test_the_scratch_copies_follow_their_rule_block_by_block(data):
    n = data.draw(st.integers(1, 12))
    ref = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    null_block = data.draw(st.booleans())
    cached = data.draw(st.lists(st.lists(st.integers(0, n - 1), min_size=1, max_size=3), max_size=3))
    cow = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2))
    k = data.draw(st.integers(0, 50))
    pool = SimpleNamespace(ref=np.array(ref, dtype=np.int32), null_block=null_block,
                           cached={("key", i): blocks for i, blocks in enumerate(cached)})
    assert scratch_pairs(pool, cow, k) == scratch_pairs_block_by_block(ref, cached, null_block, cow, k)
    assert pool.ref.tolist() == ref  # the pool is read, never written
