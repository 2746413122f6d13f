"""Finding the slot-mapping function to test: one of ours by name, or a third
party's by `MODULE:FUNCTION` or `path/to/file.py:FUNCTION`.

Every function follows the plug-in contract (docs/plugins.md):

    fn(query_start_loc, positions, block_table, slot_mapping, *, kv_block_size,
       kernel_block_size, cp_world_size, cp_rank, cp_interleave) -> None
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Callable, Protocol

import torch


class SlotMappingFn(Protocol):
    def __call__(self, query_start_loc: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
                 slot_mapping: torch.Tensor, *, kv_block_size: int, kernel_block_size: int,
                 cp_world_size: int, cp_rank: int, cp_interleave: int) -> None: ...


KEYWORDS = ("kv_block_size", "kernel_block_size", "cp_world_size", "cp_rank", "cp_interleave")


def builtin_kernels() -> dict[str, Callable[[], SlotMappingFn]]:
    """Our own kernels by name, imported lazily (after the backend is chosen)."""
    def per_request() -> SlotMappingFn:
        from blocktable.slot import slot_mapping_per_request

        return slot_mapping_per_request

    def tiled() -> SlotMappingFn:
        from blocktable.slot import slot_mapping_tiled

        return slot_mapping_tiled

    def specialized() -> SlotMappingFn:
        from blocktable.slot import slot_mapping_tiled_specialized

        return slot_mapping_tiled_specialized

    return {"triton": tiled, "triton-tiled": tiled, "triton-specialized": specialized,
            "triton-per-request": per_request}


class PluginError(ValueError):
    """The kernel named on the command line cannot be found or does not fit the contract."""


def load(spec: str, extra: dict[str, Callable[[], SlotMappingFn]] | None = None) -> SlotMappingFn:
    """Resolve a built-in name, `package.module:function` or `file.py:function`."""
    names = {**builtin_kernels(), **(extra or {})}
    if spec in names:
        return names[spec]()
    if ":" not in spec:
        raise PluginError(f"unknown kernel {spec!r}: use one of {', '.join(names)}, "
                          f"MODULE:FUNCTION or path/to/file.py:FUNCTION")
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if path.is_dir():
            raise PluginError(f"kernel file {where} is a folder, not a file")
        if not path.is_file():
            raise PluginError(f"kernel file {where} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"blocktable_plugin_{path.stem}", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise PluginError(f"importing {where} failed: {type(e).__name__}: {e}") from e
    else:
        if not where:
            raise PluginError(f"kernel {spec!r} names no module before the colon")
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise PluginError(f"cannot import module {where!r}: {e}") from e
        except Exception as e:  # the module was found and raised while importing
            raise PluginError(f"importing module {where!r} failed: {type(e).__name__}: {e}") from e
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        raise PluginError(f"{where} has no function {name!r}" if fn is None else
                          f"{where}: {name!r} is not a function (it is a {type(fn).__name__})")
    check_signature(fn, spec)
    return fn


def check_signature(fn: Callable, spec: str) -> None:
    """The contract's four positional tensors and five keywords must be accepted."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and C extensions: trust, the first call will tell
    params = sig.parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [k for k in KEYWORDS if k not in params]
    if missing:
        raise PluginError(f"{spec} does not follow the plug-in contract: missing keyword "
                          f"argument(s) {', '.join(missing)}")
    positional = [p for p in params.values() if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                           inspect.Parameter.POSITIONAL_OR_KEYWORD)
                  and p.name not in KEYWORDS]
    if len(positional) < 4 and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values()):
        raise PluginError(f"{spec} does not follow the plug-in contract: it takes {len(positional)} positional "
                          f"tensors, the contract passes 4 (query_start_loc, positions, block_table, slot_mapping)")
