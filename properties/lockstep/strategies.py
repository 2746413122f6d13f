"""The lockstep's Hypothesis strategies: worlds (KV-cache groups, DCP, pools, sizes,
prefix caching, KV caches) and the arguments of the machine's rules, each
documented with what it aims at. Strategies draw plain data; turning them into
tensors is the caller's business, so the same draw feeds both sides.

A strategy's code is part of what a seed means (Hypothesis labels a composite
strategy by its code), so a change here changes the programs a seed gives.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

from hypothesis import strategies as st

from blocktable.properties.lockstep.prompts import VOCAB
from blocktable.properties.slot.draw import divisors
from blocktable.properties.world import GroupConfig, KVConfig, V2Config, WorldConfig
from blocktable.reference import GroupLayout
from blocktable.reference.layout import INT32_MAX

# The world's strategies are built once: Hypothesis caches what it learns about a
# strategy (its label, whether it can be empty) on the object, so a strategy made
# afresh inside every draw costs more than the draw itself.
_B = st.sampled_from([1, 2, 4, 8, 16])
_B_SMALL = st.sampled_from([1, 2])  # prefix-caching worlds: blocks fill, and are hit, within short prompts
_K_OVER_B_SMALL = st.sampled_from([1, 2, 3, 3, 4])  # block sizes that do not divide each other, often
_K_OVER_B = st.sampled_from([1, 1, 2, 3, 4])
_PREFIX_CACHING = st.booleans()  # True: a prefix-caching world
# "0": none (the same draws, prefix caching off); "fresh": every world that can caches
# prefixes and admits with fresh blocks (other draws: for runs aimed at §8's admissions);
# "fresh-groups": as "fresh", with two or more KV-cache groups (§8's admissions across groups)
PREFIX_WORLDS_VARIABLE = "BLOCKTABLE_PREFIX_WORLDS"
ADMISSION_MODES = ("fresh", "fresh-groups")  # the modes aimed at §8's admissions
PREFIX_MAX_MODEL_LEN = 512
_KV = st.integers(0, 3)  # 0-2: a world with KV caches
KV_WORLDS_VARIABLE = "BLOCKTABLE_KV_WORLDS"  # "0": none (the same draws, no KV caches)
V2_WORLDS_VARIABLE = "BLOCKTABLE_V2_WORLDS"  # "0": none (the same draws, no V2 tables)
V2_KERNELS_VARIABLE = "BLOCKTABLE_V2_KERNELS"  # ours in the V2 worlds: "triton" or "torch"
_V2 = st.integers(0, 3)  # 0: a world that keeps V2 block tables beside the V1 ones
_SLOTS_OFF = st.integers(0, 5)  # 0: this group's V2 slot mapping is switched off
_FREE_ORDER = st.sampled_from(["tail", "vllm"])  # docs/contract.md §6's option, drawn last
KV_MAX_CELLS = 1 << 20  # cells of one group's cache memory, beyond which heads and D shrink to 1
_FLAVOR = st.integers(0, 5)  # 4: a world made for long prefills, 5: one made for full rows
_MAX_MODEL_LEN_LONG = st.sampled_from([1025, 2100, 16384])
_MAX_MODEL_LEN = st.sampled_from([1, 16, 17, 100, 128, 128, 129, 1024, 1024, 1025, 2100, 16383, 16384, 16385])
_FILL = st.sampled_from(["tight", "quarter", "roomy", "roomy"])
# Prefix-caching worlds' pools: small (it cycles and evicts) or not.
_PREFIX_POOL = st.one_of(st.integers(2, 12), st.integers(16, 64))
_TIGHT = st.integers(1, 4)
MAX_NUM_REQS = 6
_MAX_NUM_REQS = st.integers(1, MAX_NUM_REQS)
_BATCH_LONG = st.sampled_from([1025, 2048])
_BATCH = st.sampled_from([1, 7, 16, 64, 256, 1024, 1025, 2048])


# Every launch of the kernel under test is per rank and per group: weighted toward
# small W so that examples stay cheap under the interpreter.
WORLD_SIZES = (1, 1, 1, 2, 2, 4, 8)


@functools.cache
def _world_sizes(max_world: int) -> st.SearchStrategy[int]:
    return st.sampled_from([w for w in WORLD_SIZES if w <= max_world])


@functools.cache
def _interleaves(K: int) -> st.SearchStrategy[int]:
    return st.sampled_from(divisors(K))


@functools.lru_cache(maxsize=256)  # top varies with the pool: keep the cache bounded
def _id_offsets(top: int) -> st.SearchStrategy[int]:
    return st.one_of(st.just(0), st.just(0), st.just(top), st.integers(0, top))


def row_tokens(group: GroupConfig, cp_world_size: int) -> int:
    """The tokens a row of `group` covers at its shortest: docs/contract.md §2 rounds a
    row up to a multiple of 128 // gcd(128, K) blocks (a multiple of 128 tokens), times W
    when the group is sharded. A max_model_len of exactly that lets a request fill its row to
    the last entry, which no other max_model_len reaches for every K and W."""
    layout = GroupLayout(group.kv_block_size, group.kernel_block_size, group.sharded, cp_world_size)
    return layout.row_width(1) // layout.kernel_blocks_per_block * layout.tokens_per_block


@st.composite
def group_configs(draw: st.DrawFn, cp_world_size: int, small: bool = False) -> GroupConfig:
    """One KV-cache group: B a power of two up to 16 (up to 2 if `small`), K = B * (1..4),
    sharded or replicated, and for sharded groups under DCP an interleave I | K, often > B."""
    B = draw(_B_SMALL if small else _B)
    K = B * draw(_K_OVER_B_SMALL if small else _K_OVER_B)
    sharded = draw(st.booleans()) if cp_world_size > 1 else True
    I = draw(_interleaves(K)) if sharded and cp_world_size > 1 else 1
    return GroupConfig(K, B, sharded, I)


@functools.cache
def _group_lists(cp_world_size: int, max_groups: int, small: bool,
                 several: bool = False) -> st.SearchStrategy[list[GroupConfig]]:
    several_groups = st.lists(group_configs(cp_world_size, small), min_size=2, max_size=max_groups)
    if several and max_groups >= 2:
        return several_groups
    one_or_more = st.lists(group_configs(cp_world_size, small), min_size=1, max_size=max_groups)
    if not small or max_groups < 2:
        return one_or_more
    # Prefix-caching worlds: several groups half the time, where keys must name their
    # group and a hit must suit every group's block size.
    return st.one_of(one_or_more, several_groups)


@st.composite
def worlds(draw: st.DrawFn, max_groups: int = 3, max_world: int = 8) -> WorldConfig:
    """A whole configuration, biased toward edges: 1-3 groups, W in {1, 2, 4, 8},
    max_model_len and Tmax at 1, around 1024 and around 16k, or max_model_len exactly
    one row (so that rows fill to their width), with or without the null block, table
    ids offset to the top of int32 (a large pool id offset), and a pool from nearly
    full (a couple of blocks) to roomy (every row at full length)."""
    # One world in six is made for long prefills: rows and a token budget past the
    # interpreter's 1024-token tile and a roomy pool, so that a chunk crosses a tile.
    # One in six is made for full rows: max_model_len exactly the first group's
    # shortest row, a roomy pool and a budget for a whole row in one or two steps, so
    # that a row fills to its last entry (an off-by-one at the width shows only there).
    # Their steps schedule a thousand tokens or more, and every step launches the
    # kernel once per group and rank: they keep to two ranks and two groups, so that
    # no example costs seconds under the interpreter (Hypothesis dwells near the
    # examples it has, so one costly world would slow a whole run).
    flavor = draw(_FLAVOR)
    prefix_mode = os.environ.get(PREFIX_WORLDS_VARIABLE, "1")
    aimed = prefix_mode in ADMISSION_MODES
    # Runs aimed at §8's admissions want every world to cache prefixes, which these two kinds never do.
    long_prefill, full_rows = not aimed and flavor == 4, not aimed and flavor == 5
    if long_prefill or full_rows:
        max_world, max_groups = min(max_world, 2), min(max_groups, 2)
    W = draw(_world_sizes(max_world))
    # One world in two (but not the long-prefill and full-rows ones, below) caches
    # prefixes, with small blocks, short rows and small pools: the reference keys every
    # block by its whole prefix (a lookup costs the square of the prompt's length), and
    # hits and evictions come from prompts that share blocks in a pool that cycles.
    prefix_caching = (draw(_PREFIX_CACHING) and prefix_mode != "0") or aimed
    groups = tuple(draw(_group_lists(W, max_groups, prefix_caching, several=prefix_mode == "fresh-groups")))
    max_num_reqs = draw(_MAX_NUM_REQS)
    prefix_caching = prefix_caching and not (long_prefill or full_rows)
    if full_rows:
        max_model_len = row_tokens(groups[0], W)
    else:
        max_model_len = draw(_MAX_MODEL_LEN_LONG if long_prefill else _MAX_MODEL_LEN)
    null_block = draw(st.booleans())
    # Blocks to hold every row at up to 2100 tokens (every token of a full-rows world)
    # in every group: "roomy".
    reach = max_model_len if full_rows else min(max_model_len, 2100)
    roomy = sum(-(-reach // (g.kv_block_size * (W if g.sharded else 1))) for g in groups) * max_num_reqs
    if prefix_caching:
        max_model_len = min(max_model_len, PREFIX_MAX_MODEL_LEN)
    if prefix_caching:
        usable = draw(_PREFIX_POOL)
    else:
        fill = "roomy" if long_prefill or full_rows else draw(_FILL)
        usable = {"tight": draw(_TIGHT), "quarter": max(1, roomy // 4), "roomy": roomy}[fill]
    num_blocks = min(usable, 4096) + (1 if null_block else 0)
    largest_P = max(g.kv_block_size // g.kernel_block_size for g in groups)
    top = (INT32_MAX - (largest_P - 1)) // largest_P - (num_blocks - 1)
    id_offset = draw(_id_offsets(top))
    batch = draw(_BATCH_LONG if long_prefill or full_rows else _BATCH)
    # Three worlds in four with table ids from 0 (but not the long-prefill or full-rows
    # ones) keep KV caches. They change nothing else about the world: a seed gives the
    # same programs with BLOCKTABLE_KV_WORLDS=0. Large caches get one head of D = 1.
    kv = draw(kv_configs()) if draw(_KV) < 3 and not (id_offset or long_prefill or full_rows) else None
    if kv is not None and os.environ.get(KV_WORLDS_VARIABLE, "1") != "0":
        cells = max(num_blocks * g.kv_block_size * (W if g.sharded else 1) for g in groups) * 2
        if cells * kv.num_heads * (kv.head_size + kv.pad) > KV_MAX_CELLS:
            kv = dataclasses.replace(kv, num_heads=1, head_size=1, pad=0)
    else:
        kv = None
    # Prefix-caching worlds draw last, so that the other worlds a seed gives stay as
    # they were: half of them admit with fresh blocks, and every one spreads its
    # prompts' symbols over token ids.
    fresh_admission = (draw(st.booleans()) or aimed) if prefix_caching else False
    vocabulary = draw(vocabularies()) if prefix_caching else ()
    # One world in four, of every kind, keeps V2 block tables too, drawn last for the
    # same reason. §10 has one interleave for every group: under DCP the sharded
    # groups take the largest interleave that divides every one's block size: it
    # passes B wherever a group is hybrid (P > 1), the case where allocation-block and
    # kernel-block coordinates differ (vLLM #51031); the V1 worlds keep the variety.
    v2 = None
    if draw(_V2) == 0 and os.environ.get(V2_WORLDS_VARIABLE, "1") != "0":
        v2 = V2Config(tuple(draw(_SLOTS_OFF) != 0 for _ in groups) if len(groups) > 1 else ())
        groups = _one_interleave(groups, W)
    # Every kind of world frees in either order (vLLM's since #51482 reuses a freed
    # uncached block first), drawn last like the V2 tables.
    free_order = draw(_FREE_ORDER)
    return WorldConfig(
        groups=groups, cp_world_size=W, num_blocks=num_blocks, null_block=null_block, id_offset=id_offset,
        max_num_reqs=max_num_reqs, max_model_len=max_model_len, max_num_batched_tokens=batch,
        prefix_caching=prefix_caching, kv=kv, fresh_admission=fresh_admission, vocabulary=vocabulary, v2=v2,
        free_order=free_order)


def free_order_of(orders: tuple[str, ...], world: WorldConfig) -> WorldConfig:
    """`world`, freeing in its drawn order if a pool class follows it, else in the
    first order the class declares (docs/contract.md §6)."""
    return world if world.free_order in orders else dataclasses.replace(world, free_order=orders[0])


def _one_interleave(groups: tuple[GroupConfig, ...], W: int) -> tuple[GroupConfig, ...]:
    """§10's one interleave for every group: under DCP the sharded groups take the
    largest that divides every one's block size."""
    sharded = [g for g in groups if g.sharded and W > 1]
    if not sharded:
        return groups
    I = math.gcd(*(g.kv_block_size for g in sharded))
    return tuple(dataclasses.replace(g, cp_interleave=I) if g.sharded else g for g in groups)


def with_v2_tables(world: WorldConfig) -> WorldConfig:
    """`world` keeping V2 block tables (every group's slot mapping on), for a V2 table
    class under test (docs/contract.md §11): every world drives it."""
    if world.v2 is not None:
        return world
    return dataclasses.replace(world, v2=V2Config(), groups=_one_interleave(world.groups, world.cp_world_size))


def uniform_groups_of(world: WorldConfig) -> WorldConfig:
    """`world` for a table class that declares uniform groups (docs/contract.md §11, as
    vLLM's V1 table, which applies one DCP world and one interleave to every group):
    under DCP every group sharded, with the interleave the first sharded group drew
    (else 1), made to divide every group's block size (the gcd), so that a world of
    one group keeps its drawn interleave."""
    if world.cp_world_size == 1:
        return world
    drawn = next((g.cp_interleave for g in world.groups if g.sharded), 1)
    I = math.gcd(drawn, *(g.kv_block_size for g in world.groups))
    return dataclasses.replace(world, groups=tuple(dataclasses.replace(g, sharded=True, cp_interleave=I)
                                                   for g in world.groups))


TOKEN_ID_TOP = INT32_MAX - 1  # token ids lie in [0, 2**31 - 1)
_TOKEN_BASE = st.one_of(st.integers(0, TOKEN_ID_TOP), st.sampled_from([0, TOKEN_ID_TOP]))
_TOKEN_BIT = st.integers(0, 30)
# The last digit's bit is one of the high 15: two symbols then differ only above bit
# 15 in every world, where keys that keep the low half of an id (an int16 hash, a
# 16-bit mask) merge them.
_TOKEN_HIGH_BIT = st.integers(16, 30)


@st.composite
def vocabularies(draw: st.DrawFn) -> tuple[int, ...]:
    """Token ids for the prompts' VOCAB symbols: a base id, and one bit position per
    binary digit of a symbol, where the symbols' ids differ (the last one above bit
    15). Hits stay as frequent as with the symbols themselves, and a key that loses
    any bit of an id merges two symbols in the worlds whose positions it loses: every
    bit of an id matters in some world, the high half in every one."""
    base = draw(_TOKEN_BASE)
    positions: list[int] = []
    for digit in range(max(1, (VOCAB - 1).bit_length())):
        bit = draw(_TOKEN_BIT if digit == 0 else _TOKEN_HIGH_BIT)
        while bit in positions:  # distinct positions: the next free one up, in the digit's range
            bit = bit + 1 if bit < 30 else (16 if digit else 0)
        positions.append(bit)
    return spread(base, positions)


def spread(base: int, positions: list[int]) -> tuple[int, ...]:
    """Symbol s's id: `base` with bit positions[k] flipped where s's binary digit k is 1.
    Should one id be 2**31 - 1, every id flips a bit that no symbol uses as well."""
    ids = [base ^ sum(((s >> k) & 1) << p for k, p in enumerate(positions)) for s in range(VOCAB)]
    if INT32_MAX in ids:
        spare = next(b for b in range(31) if b not in positions)
        ids = [t ^ (1 << spare) for t in ids]
    return tuple(ids)


# What a KV world draws (kv_configs); lockstep/warm/kv.py compiles a kernel variant for each.
KV_HEADS = (1, 2, 3)
KV_HEAD_SIZES = (1, 2, 3, 4, 8)
KV_DTYPES = ("float16", "bfloat16", "float32")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")
KV_SCALES = (1.0, 1.0, 0.5, 0.37, 2.5, 0.0173, 96.0)
_SCALES = st.sampled_from(KV_SCALES)


@st.composite
def kv_configs(draw: st.DrawFn) -> KVConfig:
    """docs/contract.md §9's caches, small: 1-3 heads, D of 1-8 (odd ones too), every
    dtype, both layouts, joint or separate caches, padded strides, fp8 with scales that
    are not powers of two."""
    fp8 = draw(st.booleans())
    return KVConfig(num_heads=draw(st.integers(KV_HEADS[0], KV_HEADS[-1])),
                    head_size=draw(st.sampled_from(KV_HEAD_SIZES)), dtype=draw(st.sampled_from(KV_DTYPES)),
                    kv_cache_dtype=KV_CACHE_DTYPES[fp8], layout=draw(st.sampled_from(["NHD", "HND"])),
                    joint=draw(st.booleans()), pad=draw(st.sampled_from([0, 0, 1, 3])),
                    k_scale=draw(_SCALES) if fp8 else 1.0, v_scale=draw(_SCALES) if fp8 else 1.0)


def query_lengths() -> st.SearchStrategy[int]:
    """Tokens a request asks for in one step: mostly decode-sized, sometimes a
    prefill chunk around a block or the 1024-token tile."""
    return st.sampled_from([0, 1, 1, 1, 1, 2, 3, 4, 5, 8, 15, 16, 17, 33, 64, 100, 1023, 1024, 1025])


def step_queries(max_rows: int = 6) -> st.SearchStrategy[list[int]]:
    return st.lists(query_lengths(), min_size=1, max_size=max_rows)


FILL = 10**6  # a chunk "as long as fits": capped at max_model_len and the token budget


def prefill_lengths() -> st.SearchStrategy[int]:
    """One long chunk: around a block, around the 1024-token tile, or as long as fits
    (which fills a row to its last entry when max_model_len is a row's worth)."""
    return st.sampled_from([9, 17, 64, 130, 1023, 1024, 1025, FILL, FILL])




def prompt_parts() -> dict[str, st.SearchStrategy]:
    """A new prompt's parts, for prefix-caching worlds: which earlier request's tokens
    it starts from (an index past them: a fresh prompt), how many of their last
    tokens it drops, whether it then ends on a whole block, and how many tokens it
    adds (`length`, drawn from a small vocabulary by `salt`: long prompts without a
    draw per token), and whether a step computes the prompt right away."""
    return dict(source=_SOURCE, cut=_CUT, whole=st.booleans(), length=_EXTRA_LENGTH, salt=_SALT,
                prefill=st.booleans())


def next_turn_lengths() -> st.SearchStrategy[int]:
    """How many tokens a conversation's next turn adds: often none or a few."""
    return _NEXT_TURN_LENGTH


_NEXT_TURN_LENGTH = st.sampled_from([0, 0, 1, 2, 5, 9, 17, 33, 65])
_SOURCE = st.integers(0, 15)
_CUT = st.sampled_from([0, 0, 1, 2, 3, 5, 8, 17, 33, 64])
_EXTRA_LENGTH = st.sampled_from([0, 1, 2, 5, 9, 17, 33, 65, 129])
_SALT = st.integers(0, 255)
