"""The world strategy's full-rows worlds: a max_model_len of exactly one row."""

import pytest

from blocktable.properties.lockstep.strategies import row_tokens
from blocktable.properties.world import GroupConfig, WorldConfig


@pytest.mark.parametrize("K, B, W, sharded, tokens", [
    (16, 16, 1, True, 128),  # 8 blocks of 16: docs/contract.md §2's 128-token alignment
    (16, 4, 2, True, 256),  # sharded: each block id covers K * W tokens
    (16, 16, 8, False, 128),  # replicated: W is 1 in every formula
    (12, 4, 2, True, 240),  # align = 128 // 12 = 10 blocks of 12 tokens, times W
    (3, 1, 8, True, 1008),  # align = 128 // 3 = 42 blocks of 3 tokens, times W
    (64, 16, 4, True, 512),  # align 2
])
def test_row_tokens_by_hand(K, B, W, sharded, tokens):
    assert row_tokens(GroupConfig(K, B, sharded), W) == tokens


@pytest.mark.parametrize("W", [1, 2, 4, 8])
def test_a_request_of_row_tokens_fills_its_row_to_the_last_entry(W):
    for B in (1, 2, 4, 8, 16):
        for K in (B, 2 * B, 3 * B, 4 * B):
            for sharded in (True, False):
                group = GroupConfig(K, B, sharded)
                tokens = row_tokens(group, W)
                world = WorldConfig(groups=(group,), cp_world_size=W, max_model_len=tokens)
                layout = world.layouts()[0]
                width = layout.row_width(tokens)
                blocks = -(-tokens // layout.tokens_per_block)  # what a request of that length holds
                assert blocks * layout.kernel_blocks_per_block == width, (K, B, W, sharded)
                assert layout.row_width(tokens + 1) > width  # one token more needs a longer row
