"""What our kernels are compiled for. Triton compiles a kernel once per specialization:
every value of a compile-time constant, and for each run-time integer whether it is 1
or a multiple of 16, for each pointer whether it is 16-byte aligned. A fuzzing run
meets every size, so each of those is a compilation paid on first use, which on a
fresh GPU runner was most of a KV world's first minute (docs/results.md). The kernels
leave unspecialized what vectorizes nothing: sizes, and (V2) the alignment of
pointers that are only ever read through indices; compile-time
constants that follow a size take a few values, not one per power of two. The KV
kernels' other strides and data pointers are specialized as one: each kernel is
compiled for all of them aligned (pointers specialized, strides multiplied by a
compile-time 16) or for any (none specialized). The strides along D stay
specialized: a unit stride there is what vectorizes the KV loads and stores.

Triton ignores a name in `do_not_specialize` that is not a parameter, so a renamed
argument would silently be specialized again: these tests read the compiled
kernels' own parameter flags, in a process that imports the kernels for a GPU
(no interpreter; no GPU is needed to declare them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from blocktable import kv, v2
from blocktable.device import Backend

PROGRAM = """
import json
from blocktable.kernels import kv, oracle, v2
names = ("write_tokens", "copy_blocks", "gather_tokens", "write_tokens_unaligned", "copy_blocks_unaligned",
         "gather_tokens_unaligned", "append_block_ids", "gather_block_tables", "compute_slot_mappings")
kernels = {name: getattr(kv, name, None) or getattr(v2, name) for name in names}
kernels |= {"oracle." + name: getattr(oracle, name) for name in ("write_values", "copy_blocks", "gather")}
print(json.dumps({name: {p.name: [p.is_constexpr, bool(p.do_not_specialize), bool(p.do_not_specialize_on_alignment),
                                  p.annotation] for p in kernel.params} for name, kernel in kernels.items()}))
"""


@pytest.fixture(scope="module")
def params(tmp_path_factory) -> dict[str, dict[str, list[bool]]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path_factory.mktemp("compiled"))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


INTEGERS = {"write_tokens": ["num_tokens", "num_slots", "block_size", "num_heads",
                             "key_stride_token", "key_stride_head", "value_stride_token", "value_stride_head",
                             "kc_stride_block", "kc_stride_offset", "kc_stride_head",
                             "vc_stride_block", "vc_stride_offset", "vc_stride_head"],
            "copy_blocks": ["num_blocks", "rows", "size_2",
                            "kc_stride_0", "kc_stride_1", "kc_stride_2", "vc_stride_0", "vc_stride_1", "vc_stride_2"],
            "gather_tokens": ["table_stride_0", "num_reqs", "num_blocks", "block_size", "width",
                              "out_rows", "num_heads", "kc_stride_block", "kc_stride_offset", "kc_stride_head",
                              "vc_stride_block", "vc_stride_offset", "vc_stride_head",
                              "ok_stride_token", "ok_stride_head", "ov_stride_token", "ov_stride_head"]}
D_STRIDES = {"write_tokens": ["key_stride_d", "value_stride_d", "kc_stride_d", "vc_stride_d"],
             "copy_blocks": ["kc_stride_3", "vc_stride_3"],
             "gather_tokens": ["kc_stride_d", "vc_stride_d", "ok_stride_d", "ov_stride_d"]}
DATA_POINTERS = {"write_tokens": ["key_ptr", "value_ptr", "key_cache_ptr", "value_cache_ptr"],
                 "copy_blocks": ["key_cache_ptr", "value_cache_ptr"],
                 "gather_tokens": ["key_cache_ptr", "value_cache_ptr", "out_key_ptr", "out_value_ptr"]}


@pytest.mark.parametrize("kernel", sorted(INTEGERS))
def test_the_kv_kernels_compile_once_for_every_size_and_keep_the_strides_along_d(params, kernel):
    """And once for each of the two alignments: the aligned compilation specializes
    every data pointer (the wrapper sends it only aligned ones), the other none."""
    for compiled, unaligned_pointers in ((kernel, []), (kernel + "_unaligned", sorted(DATA_POINTERS[kernel]))):
        flags = params[compiled]
        unspecialized = sorted(name for name, (constexpr, dns, _, _) in flags.items() if dns)
        assert unspecialized == sorted(INTEGERS[kernel]), compiled
        for name in D_STRIDES[kernel]:
            assert flags[name][:3] == [False, False, False], (compiled, name)
        assert flags["ALIGN"][0], "ALIGN is a compile-time constant"
        assert sorted(name for name, (_, _, dns_alignment, _) in flags.items() if dns_alignment) == unaligned_pointers


def test_the_aligned_compilation_takes_only_aligned_pointers_and_strides():
    cache = torch.zeros(4, 2, 2, 16)
    assert kv.aligned_strides([cache, cache], [cache.stride(), cache.stride()]) == (
        16, [4, 2, 1, 1] * 2)  # (64, 32, 16) / 16, and the stride along D as it is
    shifted = torch.zeros(cache.numel() + 1)[1:].view(cache.shape)  # 4 bytes into its memory
    assert kv.aligned_strides([cache, shifted], [cache.stride(), shifted.stride()]) == (
        1, [64, 32, 16, 1] * 2)
    narrow = torch.zeros(4, 2, 2, 24)[..., :16]  # a head stride of 24: not a multiple of 16
    assert kv.aligned_strides([cache, narrow], [cache.stride(), narrow.stride()])[0] == 1
    assert kv.aligned_strides([cache], [(32, 1)]) == (16, [2, 1])  # the last stride is never divided
    assert kv.aligned_strides([cache], [(32, 8)]) == (16, [2, 8])


def test_the_gathers_search_compiles_once_for_every_batch_of_up_to_16_requests():
    """Its halvings are compiled in, and were one compilation per power of two of the
    batch; extra halvings are harmless, so their count is rounded up."""
    steps = {n: kv.search_steps(n) for n in range(1, 5000)}
    assert all(2 ** s >= n for n, s in steps.items())  # enough halvings to narrow n requests to one
    assert {steps[n] for n in range(1, 17)} == {4} and {steps[n] for n in range(17, 257)} == {8}


@pytest.mark.parametrize("kernel", ["append_block_ids", "gather_block_tables", "compute_slot_mappings"])
def test_the_v2_kernels_compile_once_for_every_alignment_of_their_pointers(params, kernel):
    """Every argument that is not a compile-time constant or a run-time integer (the
    int64 sizes are all unspecialized already) is a pointer: none is specialized on
    its alignment, nor any integer on its value."""
    for name, (constexpr, dns, dns_alignment, _) in params[kernel].items():
        if not constexpr:
            assert dns or dns_alignment, name


@pytest.mark.parametrize("kernel", ["write_values", "copy_blocks", "gather"])
def test_the_oracles_kernels_compile_once_per_tile(params, kernel):
    """The harness's instruments: no integer specialized on its value, no pointer on
    its alignment, and slot_base typed int64 whatever its value (a cache of huge block
    ids starts past int32), so that the tile is all that makes a variant."""
    flags = params["oracle." + kernel]
    assert [name for name, (constexpr, *_) in flags.items() if constexpr] == ["BLOCK"]
    for name, (constexpr, dns, dns_alignment, _) in flags.items():
        if not constexpr:
            assert dns != name.endswith("_ptr") and dns_alignment == name.endswith("_ptr"), name
    assert flags["slot_base"][3] == "i64"


def test_a_copy_compiles_one_tile_per_row_width_whatever_the_block_shape():
    gpu = Backend("cuda", torch.device("cuda"))
    for inner in (1, 3, 8, 128, 8192):
        tiles = {kv.launch_rows(gpu, rows, inner) for rows in (1, 2, 5, 16, 100, 4096)}
        assert len(tiles) == 1, (inner, tiles)
    assert kv.launch_rows(gpu, 128, 128) == (32, 4)  # 4K elements a program, as before


def test_the_v2_column_tile_takes_two_sizes():
    tiles = {width: v2._columns([width]) for width in range(0, 5000, 7)}
    assert set(tiles.values()) == {v2.NARROW_COLUMNS, v2.TILE}
    assert all(tile >= min(width, v2.TILE) for width, tile in tiles.items())
