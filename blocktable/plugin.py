"""Finding the kernels to test: ours by name, or a third party's by `MODULE:FUNCTION`
or `path/to/file.py:FUNCTION`. Four kinds, each with its contract (docs/plugins.md):

    slot mapping:  fn(query_start_loc, positions, block_table, slot_mapping, *, kv_block_size,
                      kernel_block_size, cp_world_size, cp_rank, cp_interleave) -> None
    kv-write:      fn(key, value, key_cache, value_cache, slot_mapping, *, layout,
                      kv_cache_dtype, k_scale, v_scale) -> None
    kv-copy:       fn(key_caches, value_caches, block_mapping) -> None
    kv-gather:     fn(key_cache, value_cache, block_table, cu_lens, out_key, out_value, *,
                      layout, kv_cache_dtype, k_scale, v_scale) -> None
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch


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
KV_KINDS = tuple(KV_CONTRACTS)


def builtin_kernels() -> dict[str, Callable[[], SlotMappingFn]]:
    """Our own slot-mapping kernels by name, imported lazily (after the backend is chosen)."""
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


_KV_FUNCTIONS = {"write": ("write", "write_torch"), "copy": ("copy_blocks", "copy_blocks_torch"),
                 "gather": ("gather", "gather_torch")}


def builtin_kv_kernels(kind: str) -> dict[str, Callable[[], Callable]]:
    """Ours for one KV kind: "triton" (blocktable.kv) and "torch" (blocktable.kv_torch,
    the benchmark's indexing-op baseline)."""
    ours, torch_native = _KV_FUNCTIONS[kind]

    def triton() -> Callable:
        from blocktable import kv

        return getattr(kv, ours)

    def native() -> Callable:
        from blocktable import kv_torch

        return getattr(kv_torch, torch_native)

    return {"triton": triton, "torch": native}


@dataclass(frozen=True)
class KVKernels:
    """The three KV kernels a run uses, each ours ("triton", the default) or a plug-in;
    `specs` keeps how each was named, for case files and reports."""

    write: Callable
    copy: Callable
    gather: Callable
    specs: dict[str, str]


def load_kv_kernels(write: str | None = None, copy: str | None = None, gather: str | None = None) -> KVKernels:
    specs = {"write": write or "triton", "copy": copy or "triton", "gather": gather or "triton"}
    return KVKernels(**{kind: load_kv(kind, spec) for kind, spec in specs.items()}, specs=specs)


class PluginError(ValueError):
    """The kernel named on the command line cannot be found or does not fit the contract."""


def load(spec: str, extra: dict[str, Callable[[], SlotMappingFn]] | None = None) -> SlotMappingFn:
    """Resolve a slot-mapping kernel: a built-in name, `package.module:function` or `file.py:function`."""
    return resolve(spec, {**builtin_kernels(), **(extra or {})}, SLOT_MAPPING)


def load_kv(kind: str, spec: str) -> Callable:
    """Resolve a KV kernel of `kind` ("write", "copy" or "gather") the same way."""
    if kind not in KV_CONTRACTS:
        raise PluginError(f"unknown KV kernel kind {kind!r}: one of {', '.join(KV_KINDS)}")
    return resolve(spec, builtin_kv_kernels(kind), KV_CONTRACTS[kind])


def resolve(spec: str, names: dict[str, Callable[[], Callable]], contract: Contract) -> Callable:
    if spec in names:
        return names[spec]()
    noun = contract.noun
    if ":" not in spec:
        raise PluginError(f"unknown {noun} {spec!r}: use one of {', '.join(names)}, "
                          f"MODULE:FUNCTION or path/to/file.py:FUNCTION")
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if path.is_dir():
            raise PluginError(f"{noun} file {where} is a folder, not a file")
        if not path.is_file():
            raise PluginError(f"{noun} file {where} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"blocktable_plugin_{path.stem}", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise PluginError(f"importing {where} failed: {type(e).__name__}: {e}") from e
    else:
        if not where:
            raise PluginError(f"{noun} {spec!r} names no module before the colon")
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
    check_signature(fn, spec, contract)
    return fn


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
