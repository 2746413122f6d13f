"""What each kind of plug-in is called with (docs/plugins.md): its positional
arguments and its keywords, and the check that a function accepts them.

    slot mapping:  fn(query_start_loc, positions, block_table, slot_mapping, *, kv_block_size,
                      kernel_block_size, cp_world_size, cp_rank, cp_interleave) -> None
    kv-write:      fn(key, value, key_cache, value_cache, slot_mapping, *, layout,
                      kv_cache_dtype, k_scale, v_scale) -> None
    kv-copy:       fn(key_caches, value_caches, block_mapping) -> None
    kv-gather:     fn(key_cache, value_cache, block_table, cu_lens, out_key, out_value, *,
                      layout, kv_cache_dtype, k_scale, v_scale) -> None
    v2-append:     fn(rows, cnt_dev, cnt, staged_group, staged_row, staged_start, staged_ids,
                      cu_staged) -> None
    v2-gather:     fn(rows, cnt_dev, inp, idx_mapping, num_reqs_padded) -> None
    v2-slots:      fn(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, *,
                      kv_block_sizes, kernel_block_sizes, sharded, enabled, cp_world_size,
                      cp_rank, cp_interleave) -> None

A function must accept exactly what its kind passes: fewer positional parameters, a
missing keyword, or a parameter the call would leave without a value (more required
positional parameters, an unknown keyword-only one without a default) is a plug-in of
another kind, refused before anything runs.
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
    outputs: tuple[str, ...] = ()  # the positional arguments it writes in place; the others it only reads


KEYWORDS = ("kv_block_size", "kernel_block_size", "cp_world_size", "cp_rank", "cp_interleave")
KV_KEYWORDS = ("layout", "kv_cache_dtype", "k_scale", "v_scale")
SLOT_MAPPING = Contract("kernel", ("query_start_loc", "positions", "block_table", "slot_mapping"), KEYWORDS,
                        ("slot_mapping",))
KV_CONTRACTS = {
    "write": Contract("kv-write kernel", ("key", "value", "key_cache", "value_cache", "slot_mapping"), KV_KEYWORDS,
                      ("key_cache", "value_cache")),
    "copy": Contract("kv-copy kernel", ("key_caches", "value_caches", "block_mapping"), (),
                     ("key_caches", "value_caches")),
    "gather": Contract("kv-gather kernel", ("key_cache", "value_cache", "block_table", "cu_lens", "out_key",
                                            "out_value"), KV_KEYWORDS, ("out_key", "out_value")),
}
KV_KINDS = tuple(KV_CONTRACTS)  # the one list of KV kinds, in the order flags, cases and reports use
V2_CONTRACTS = {
    "append": Contract("v2-append kernel", ("rows", "cnt_dev", "cnt", "staged_group", "staged_row", "staged_start",
                                            "staged_ids", "cu_staged"), (), ("rows", "cnt_dev")),
    "gather": Contract("v2-gather kernel", ("rows", "cnt_dev", "inp", "idx_mapping", "num_reqs_padded"), (),
                       ("inp",)),
    "slots": Contract("v2-slots kernel", ("rows", "idx_mapping", "query_start_loc", "positions", "slots",
                                          "num_tokens_padded"),
                      ("kv_block_sizes", "kernel_block_sizes", "sharded", "enabled", "cp_world_size", "cp_rank",
                       "cp_interleave"), ("slots",)),
}
V2_KINDS = tuple(V2_CONTRACTS)  # --v2-append, --v2-gather, --v2-slots


def check_signature(fn: Callable, spec: str, contract: Contract = SLOT_MAPPING) -> None:
    """`fn` must accept the contract's positional arguments and keywords, and need
    nothing else: a function that a call of this kind would leave with an argument
    unfilled is a plug-in of another kind (a KV write named as a copy)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and C extensions: trust, the first call will tell
    check_parameters(sig, spec, contract)


def check_parameters(sig: inspect.Signature | None, spec: str, contract: Contract) -> None:
    """check_signature on a signature already taken (a method's, without `self`); None:
    no signature to read, trusted."""
    if sig is None:
        return
    params = sig.parameters.values()
    kind = inspect.Parameter
    if not any(p.kind is kind.VAR_KEYWORD for p in params):
        missing = [k for k in contract.keywords if k not in sig.parameters]
        if missing:
            # A name the contract does not pass is most often the user's spelling of a missing one.
            extra = [p.name for p in params if p.kind is kind.KEYWORD_ONLY and p.name not in contract.keywords]
            instead = f" (it takes {', '.join(extra)}, which the contract does not pass)" if extra else ""
            raise PluginError(f"{spec} does not follow the plug-in contract: missing keyword "
                              f"argument(s) {', '.join(missing)}{instead}")
    positional = [p for p in params if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)
                  and p.name not in contract.keywords]
    wanted = len(contract.positional)
    what = "tensors" if contract is SLOT_MAPPING else "arguments"
    if len(positional) < wanted and not any(p.kind is kind.VAR_POSITIONAL for p in params):
        raise PluginError(f"{spec} does not follow the plug-in contract: it takes {len(positional)} positional "
                          f"{what}, the contract passes {wanted} ({', '.join(contract.positional)})")
    required = [p for p in positional if p.default is kind.empty]
    if len(required) > wanted:
        unfilled = [p.name for p in required[wanted:]]
        raise PluginError(f"{spec} does not follow the plug-in contract of a {contract.noun}: it needs "
                          f"{len(required)} positional {what}, the contract passes {wanted} "
                          f"({', '.join(contract.positional)}); {', '.join(unfilled)} would have no value")
    unknown = [p.name for p in params if p.kind is kind.KEYWORD_ONLY and p.default is kind.empty
               and p.name not in contract.keywords]
    if unknown:
        raise PluginError(f"{spec} does not follow the plug-in contract of a {contract.noun}: keyword "
                          f"argument(s) {', '.join(unknown)} have no default, and the contract passes only "
                          f"{', '.join(contract.keywords) or 'none'}")
