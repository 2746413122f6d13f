"""docs/contract.md §1-§2: group configuration, row width, map_to_kernel_blocks."""

import pytest

from blocktable.reference import GroupLayout, map_to_kernel_blocks, row_width


def test_map_to_kernel_blocks_spec_example():
    # docs/contract.md §3: [5, 9], P=2 -> [10, 11, 18, 19]
    assert map_to_kernel_blocks([5, 9], 2) == [10, 11, 18, 19]
    assert map_to_kernel_blocks([5, 9], 1) == [5, 9]
    assert map_to_kernel_blocks([], 4) == []


@pytest.mark.parametrize("K, align", [
    # docs/contract.md §2's examples of vLLM's rule (#50302): align = 128 // gcd(128, K).
    (16, 8), (48, 8), (96, 4), (256, 1),
    (1, 128), (12, 32), (64, 2), (128, 1), (3, 128), (200, 16), (384, 1), (1000, 16),
])
def test_row_width_aligns_the_block_count_by_vllms_rule(K, align):
    # One token needs one block, rounded up to `align` blocks (P = 1, W = 1).
    assert row_width(1, K, K, 1) == align
    # align + 1 blocks' worth of tokens needs two alignments' worth of blocks.
    assert row_width(align * K + 1, K, K, 1) == 2 * align


@pytest.mark.parametrize("max_model_len, K, B, W, expected", [
    # K=96: align = 128 // gcd(128, 96) = 4. 1000 tokens: cdiv(1000, 96) = 11 -> 12 blocks.
    (1000, 96, 96, 1, 12),
    # K=96, B=32 (P=3): 12 allocation blocks -> 36 kernel blocks.
    (1000, 96, 32, 1, 36),
    # K=48: align 8. cdiv(1000, 48) = 21 -> 24 (0.1.0's 128 // K rule gave 22).
    (1000, 48, 48, 1, 24),
    # K=16: align 8. 1030 tokens: cdiv(1030, 16) = 65 -> 72.
    (1030, 16, 16, 1, 72),
    # K=16, W=4: cdiv(1030, 64) = 17 -> 24.
    (1030, 16, 16, 4, 24),
    # K=256: align 1. cdiv(1000, 256) = 4 -> 4 allocation blocks, P=4 -> 16.
    (1000, 256, 64, 1, 16),
    # exactly a multiple: 128 tokens, K=16 -> 8 blocks, align 8 -> 8.
    (128, 16, 16, 1, 8),
    # K=1: align 128; 1 token -> 1 block -> 128.
    (1, 1, 1, 1, 128),
])
def test_row_width_by_hand(max_model_len, K, B, W, expected):
    width = row_width(max_model_len, K, B, W)
    assert width == expected
    assert width // (K // B) * K * W >= max_model_len  # the row holds every token
    assert (width // (K // B) * K) % 128 == 0  # whatever K, a row covers a multiple of 128 tokens


def test_replicated_group_uses_world_one():
    layout = GroupLayout(16, 16, sharded=False, cp_world_size=4, cp_interleave=16)
    assert layout.world == 1 and layout.interleave == 1 and layout.tokens_per_block == 16
    assert layout.row_width(1030) == 72
    sharded = GroupLayout(16, 16, sharded=True, cp_world_size=4)
    assert sharded.tokens_per_block == 64 and sharded.row_width(1030) == 24


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kv_block_size=48, kernel_block_size=32), ValueError, "kv_block_size 48 is not a multiple of kernel_block_size 32"),
    (dict(kv_block_size=0, kernel_block_size=16), ValueError, "kv_block_size must be >= 1, got 0"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_interleave=3), ValueError, "cp_interleave 3 must divide kv_block_size 16"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_interleave=32), ValueError, "cp_interleave 32"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_world_size=0), ValueError, "cp_world_size must be >= 1, got 0"),
    (dict(kv_block_size=16.0, kernel_block_size=16), TypeError, "kv_block_size must be an int, got float"),
])
def test_bad_configuration_is_rejected(kwargs, error, match):
    with pytest.raises(error, match=match):
        GroupLayout(**kwargs)


def test_row_width_rejects_bad_sizes():
    with pytest.raises(ValueError, match="kv_block_size 24 is not a multiple of kernel_block_size 16"):
        row_width(100, 24, 16)
    with pytest.raises(ValueError, match="max_model_len must be a positive int, got 0"):
        row_width(0, 16, 16)
