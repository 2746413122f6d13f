"""What each kind of plug-in is called with (docs/plugins.md): its positional
arguments and its keywords, and the check that a function accepts them.

    slot mapping:  fn(query_start_loc, positions, block_table, slot_mapping, *, kv_block_size,
                      kernel_block_size, cp_world_size, cp_rank, cp_interleave) -> None
    kv-write:      fn(key, value, key_cache, value_cache, slot_mapping, *, layout,
                      kv_cache_dtype, k_scale, v_scale) -> None
    kv-copy:       fn(key_caches, value_caches, block_mapping) -> None
    kv-gather:     fn(key_cache, value_cache, block_table, cu_lens, out_key, out_value, *,
                      layout, kv_cache_dtype, k_scale, v_scale) -> None
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from blocktable.plugin.spec import PluginError


class SlotMappingFn(Protocol):
    def __call__(self, query_start_loc: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
                 slot_mapping: torch.Tensor, *, kv_block_size: int, kernel_block_size: int,
                 cp_world_size: int, cp_rank: int, cp_interleave: int) -> None: ...


@dataclass(frozen=True)
class Contract:
    """What a kind of plug-in is called with: its positional tensors and its keywords."""

    noun: str  # how messages name it: "kernel", "kv-write kernel", ...
    positional: tuple[str, ...]
    keywords: tuple[str, ...]


KEYWORDS = ("kv_block_size", "kernel_block_size", "cp_world_size", "cp_rank", "cp_interleave")
KV_KEYWORDS = ("layout", "kv_cache_dtype", "k_scale", "v_scale")
SLOT_MAPPING = Contract("kernel", ("query_start_loc", "positions", "block_table", "slot_mapping"), KEYWORDS)
KV_CONTRACTS = {
    "write": Contract("kv-write kernel", ("key", "value", "key_cache", "value_cache", "slot_mapping"), KV_KEYWORDS),
    "copy": Contract("kv-copy kernel", ("key_caches", "value_caches", "block_mapping"), ()),
    "gather": Contract("kv-gather kernel", ("key_cache", "value_cache", "block_table", "cu_lens", "out_key",
                                            "out_value"), KV_KEYWORDS),
}
KV_KINDS = tuple(KV_CONTRACTS)  # the one list of KV kinds, in the order flags, cases and reports use


def check_signature(fn: Callable, spec: str, contract: Contract = SLOT_MAPPING) -> None:
    """The contract's positional tensors and keywords must be accepted."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and C extensions: trust, the first call will tell
    params = sig.parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        missing = [k for k in contract.keywords if k not in params]
        if missing:
            raise PluginError(f"{spec} does not follow the plug-in contract: missing keyword "
                              f"argument(s) {', '.join(missing)}")
    positional = [p for p in params.values() if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                           inspect.Parameter.POSITIONAL_OR_KEYWORD)
                  and p.name not in contract.keywords]
    wanted = len(contract.positional)
    if len(positional) < wanted and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values()):
        what = "tensors" if contract is SLOT_MAPPING else "arguments"
        raise PluginError(f"{spec} does not follow the plug-in contract: it takes {len(positional)} positional "
                          f"{what}, the contract passes {wanted} ({', '.join(contract.positional)})")
