"""The coverage labels: what the lockstep reports through `hypothesis.event` when a
program reaches a state worth reaching. `blocktable fuzz` counts them in its summary,
and the quality tier (tests/properties/lockstep/test_coverage.py) fails when the generators
stop reaching one. Every label is named here, once."""

from __future__ import annotations

from blocktable.properties.lockstep.schema import REJECTION_KINDS as KINDS

FORK_DEPTH_2 = "fork depth >= 2"
COPY_ON_WRITE = "copy-on-write"
REF_3 = "ref >= 3"
ROW_REUSED_SHORTER = "row reused shorter"
SELF_MOVE = "self-move"
SELF_SWAP = "self-swap"
TILE_CROSSING = "tile crossing"
NON_LOCAL_DCP = "non-local DCP tokens"
POOL_EXHAUSTED = "pool exhausted"
RESUMED = "resumed (recompute)"
CUDA_GRAPH_PADDING = "cuda-graph padding"
IDS_NEAR_INT32_MAX = "ids offset toward 2**31-1"
STALE_ROW = "finished row left stale"
ROW_FILLED = "row filled to its width"
# docs/contract.md §6's vLLM free order: one free puts two or more uncached blocks at
# the head (where their order shows), or, with prefix caching, splits between head and tail.
FREED_TO_HEAD = "vLLM-order free: blocks to the head"
FREED_SPLIT = "vLLM-order free: cached to the tail, uncached to the head"
# Prefix caching (docs/contract.md §8).
HIT_FREED = "prefix hit of a freed block"  # ref 0: it leaves the free queue from where it stands
HIT_IN_USE = "prefix hit of a block in use"
EVICTED = "cached block evicted"
KEY_TWO_BLOCKS = "one key with two blocks"
HIT_CAPPED_BY_LENGTH = "prefix hit limited by len - 1"
HIT_CAPPED_BY_GROUP = "prefix hit limited by another group"
RESET_REFUSED = "prefix cache reset refused"
RESET_DONE = "prefix cache reset"
# Admission with fresh blocks beyond the hits, in one call (worlds with fresh_admission).
FRESH_HIT_IN_USE = "fresh admission: a hit on a block in use"
FRESH_HIT_QUEUED = "fresh admission: a hit on a queued block"
FRESH_EVICTS = "fresh admission evicts another key's block"
FRESH_FITS_BY_IN_USE = "fresh admission fits only because hits are in use"
FRESH_HITS_ONLY = "fresh admission deferred: hits only (too few free blocks)"
FRESH_EVICTS_OTHER_GROUP = "fresh admission: group by group would evict another group's hit"
# The KV path (docs/contract.md §9), in worlds with KV caches.
KV_COPY = "KV blocks copied on write"
KV_FP8 = "KV written as fp8"
KV_GATHER = "KV sequences gathered"
# vLLM V2's block tables (docs/contract.md §10), in worlds with V2 tables.
V2_OVERWRITE = "V2 append with overwrite"
V2_PERMUTED = "V2 batch permuted"
V2_DUMMY = "V2 dummy entry (-1) in the batch"
V2_DUMMY_TOKENS = "V2 dummy entry with tokens"
V2_PADDED = "V2 batch padded"
V2_ROW_FULL = "V2 row full to its width"
V2_BLOCK_SIZES = "V2 groups with different block sizes"
V2_DCP = "V2 tables under DCP"
V2_SLOTS_OFF = "V2 group with slot mapping off"
V2_STALE = "V2 input row with stale columns"


def rejected(kind: str) -> str:
    """The label of a refused call of `kind` (lockstep/rejections.py)."""
    return f"rejected {kind}"


LABELS: tuple[str, ...] = (
    FORK_DEPTH_2, COPY_ON_WRITE, REF_3, ROW_REUSED_SHORTER, SELF_MOVE, SELF_SWAP, TILE_CROSSING, NON_LOCAL_DCP,
    POOL_EXHAUSTED, RESUMED, CUDA_GRAPH_PADDING, IDS_NEAR_INT32_MAX, STALE_ROW, FREED_TO_HEAD, FREED_SPLIT,
    *(rejected(kind) for kind in KINDS), ROW_FILLED, HIT_FREED, HIT_IN_USE, EVICTED, KEY_TWO_BLOCKS,
    HIT_CAPPED_BY_LENGTH, HIT_CAPPED_BY_GROUP, RESET_REFUSED, RESET_DONE, FRESH_HIT_IN_USE, FRESH_HIT_QUEUED,
    FRESH_EVICTS, FRESH_EVICTS_OTHER_GROUP, FRESH_FITS_BY_IN_USE, FRESH_HITS_ONLY, KV_COPY, KV_FP8, KV_GATHER,
    V2_OVERWRITE, V2_PERMUTED, V2_DUMMY, V2_DUMMY_TOKENS, V2_PADDED,
    V2_ROW_FULL, V2_BLOCK_SIZES, V2_DCP, V2_SLOTS_OFF, V2_STALE)
