"""The reference model: docs/contract.md written out in plain numpy and Python integers.

Obviously correct, not fast. Every function here is meant to be read beside
docs/contract.md, section by section; the implementation (`blocktable`, `blocktable.kernels`)
is proven equal to it, bit for bit. This package imports numpy and nothing else.
"""

from blocktable.reference.groups import MultiGroupBlockTable
from blocktable.reference.history import History
from blocktable.reference.layout import (
    NULL_BLOCK_ID,
    PAD_SLOT_ID,
    GroupLayout,
    cdiv,
    map_to_kernel_blocks,
    row_width,
)
from blocktable.reference.oracle import PagedCache
from blocktable.reference.pool import BlockPool, InvariantError
from blocktable.reference.prefix import add_request, blocks_to_add, find_prefix, resume_request
from blocktable.reference.sequence import SequenceBlocks
from blocktable.reference.slot import owner_rank, slot_mapping, slot_mappings_all_ranks, slot_of_position
from blocktable.reference.table import BlockTable
from blocktable.reference.v2 import BlockTables as V2BlockTables

__all__ = [
    "NULL_BLOCK_ID",
    "PAD_SLOT_ID",
    "BlockPool",
    "BlockTable",
    "GroupLayout",
    "History",
    "InvariantError",
    "MultiGroupBlockTable",
    "PagedCache",
    "SequenceBlocks",
    "V2BlockTables",
    "add_request",
    "blocks_to_add",
    "cdiv",
    "find_prefix",
    "map_to_kernel_blocks",
    "owner_rank",
    "resume_request",
    "row_width",
    "slot_mapping",
    "slot_mappings_all_ranks",
    "slot_of_position",
]
