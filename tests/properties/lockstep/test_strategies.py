"""The world strategy's full-rows worlds: a max_model_len of exactly one row."""

import pytest
from hypothesis import given, settings

from blocktable.properties.lockstep import strategies
from blocktable.properties.lockstep.strategies import row_tokens
from blocktable.properties.world import GroupConfig, WorldConfig


@pytest.mark.parametrize("K, B, W, sharded, tokens", [
    (16, 16, 1, True, 128),  # 8 blocks of 16: docs/contract.md §2's 128-token alignment
    (16, 4, 2, True, 256),  # sharded: each block id covers K * W tokens
    (16, 16, 8, False, 128),  # replicated: W is 1 in every formula
    (12, 4, 2, True, 768),  # align = 128 // gcd(128, 12) = 32 blocks of 12 tokens (384), times W
    (3, 1, 8, True, 3072),  # align = 128 blocks of 3 tokens (384), times W
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


def test_vocabularies_spread_the_symbols_over_31_bit_ids():
    """Distinct ids in [0, 2**31 - 1), differing from one another only in the drawn bit
    positions; over many worlds every position is drawn, the high ones included."""
    from hypothesis import given, settings

    from blocktable.properties.lockstep.prompts import VOCAB
    from blocktable.properties.lockstep.strategies import vocabularies

    differing: set[int] = set()

    @settings(max_examples=300, database=None, derandomize=True)
    @given(vocabularies())
    def check(ids: tuple[int, ...]) -> None:
        assert len(ids) == VOCAB == len(set(ids)) and all(0 <= t < 2**31 - 1 for t in ids)
        mask = ids[0] ^ ids[1] | ids[0] ^ ids[2] | ids[0] ^ ids[3]
        assert bin(mask).count("1") == 2  # two binary digits of a symbol, one bit each
        assert ids[0] ^ ids[2] >= 1 << 16  # the second digit's bit is a high one
        differing.update(b for b in range(31) if mask >> b & 1)

    check()
    assert differing == set(range(31))


def test_no_id_is_2_to_the_31_minus_1():
    from blocktable.properties.lockstep.strategies import spread

    assert spread(0, [3, 20]) == (0, 8, 1 << 20, 1 << 20 | 8)
    top = 2**31 - 2  # 0x7ffffffe: flipping bit 0 would give 2**31 - 1, so bit 2 (unused) flips in every id
    assert spread(top, [0, 1]) == (top ^ 4, top ^ 5, top ^ 6, top ^ 7)


@pytest.mark.parametrize("mode, several", [("fresh", False), ("fresh-groups", True)])
def test_worlds_aimed_at_admissions_all_cache_prefixes_and_admit_fresh(monkeypatch, mode, several):
    """BLOCKTABLE_PREFIX_WORLDS=fresh and fresh-groups (runs aimed at §8's admissions, as
    mutant C03's): every world caches prefixes and admits with fresh blocks; with
    fresh-groups every one has two or more groups."""
    monkeypatch.setenv(strategies.PREFIX_WORLDS_VARIABLE, mode)
    groups = set()

    @settings(max_examples=30, database=None)
    @given(strategies.worlds())
    def check(world):
        assert world.prefix_caching and world.fresh_admission
        groups.add(len(world.groups))

    check()
    assert (min(groups) >= 2) if several else (1 in groups), groups
