"""Finding the functions under test: ours by name, or a third party's by
`MODULE:FUNCTION` or `path/to/file.py:FUNCTION` (blocktable.plugin.spec), checked
against the contract of their kind (blocktable.plugin.contract)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blocktable.plugin.classes import CLASS_CONTRACTS, CLASS_KINDS, builtin_classes, check_class
from blocktable.plugin.contract import (
    KV_CONTRACTS,
    KV_KINDS,
    SLOT_MAPPING,
    V2_CONTRACTS,
    V2_KINDS,
    Contract,
    SlotMappingFn,
    check_signature,
)
from blocktable.plugin.spec import KernelSpec, PluginError

if TYPE_CHECKING:
    from blocktable.v2 import V2Kernels

Builtins = dict[str, Callable[[], Callable]]  # name -> a loader (imports lazily: after the backend is chosen)


def builtin_kernels() -> Builtins:
    """Our own slot-mapping kernels by name."""
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


def builtin_kv_kernels(kind: str) -> Builtins:
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


_V2_FUNCTIONS = {"append": "append", "gather": "gather", "slots": "slot_mappings"}


def builtin_v2_kernels(kind: str) -> Builtins:
    """Ours for one V2 kind: "triton" (blocktable.v2, kernels/v2.py) and "torch"
    (blocktable.v2_torch, the benchmark's indexing-op baseline)."""
    name = _V2_FUNCTIONS[kind]

    def triton() -> Callable:
        from blocktable import v2

        return getattr(v2, f"{name}_triton")

    def native() -> Callable:
        from blocktable import v2_torch

        return getattr(v2_torch, f"{name}_torch")

    return {"triton": triton, "torch": native}


@dataclass(frozen=True)
class V2Plugins:
    """The three V2 block-table kernels a run uses (docs/contract.md §10.10), each ours
    or a plug-in; `specs` keeps how each was named, by kind."""

    append: Callable
    gather: Callable
    slots: Callable
    specs: dict[str, str]

    def kernels(self) -> V2Kernels:
        """As blocktable.v2.BlockTables takes them."""
        from blocktable.v2 import V2Kernels

        return V2Kernels(append=self.append, gather=self.gather, slot_mappings=self.slots)


def load_v2_kernels(specs: dict[str, str] | None = None, ours: str = "triton") -> V2Plugins:
    """The V2 kernels `specs` names by kind; `ours` for a kind it does not name."""
    chosen = {kind: (specs or {}).get(kind) or ours for kind in V2_KINDS}
    return V2Plugins(**{kind: load_v2(kind, spec) for kind, spec in chosen.items()}, specs=chosen)


def load_v2(kind: str, spec: str) -> Callable:
    """Resolve a V2 kernel of `kind` ("append", "gather" or "slots")."""
    if kind not in V2_CONTRACTS:
        raise PluginError(f"unknown V2 kernel kind {kind!r}: one of {', '.join(V2_KINDS)}")
    return resolve(spec, builtin_v2_kernels(kind), V2_CONTRACTS[kind])


@dataclass(frozen=True)
class KVKernels:
    """The three KV kernels a run uses, each ours ("triton", the default) or a plug-in;
    `specs` keeps how each was named, for case files and reports."""

    write: Callable
    copy: Callable
    gather: Callable
    specs: dict[str, str]


@dataclass(frozen=True)
class Plugins:
    """Everything under test in one run: the slot-mapping kernel and the KV kernels,
    each ours or a plug-in, how the slot-mapping kernel was named, and whether the
    KV outputs' NaN encodings are held exactly (`--strict-nan`; docs/contract.md §9
    lets them differ)."""

    slot: SlotMappingFn
    kv: KVKernels
    slot_spec: str = "triton"
    strict_nan: bool = False
    v2: V2Plugins | None = None  # None: the V2 worlds use ours
    pool: type | None = None  # a pool class (docs/contract.md §11) in place of ours; None: ours, directly
    classes: dict[str, str] | None = None  # how each class plug-in was named, by kind
    table: type | None = None  # a V1 table class (docs/contract.md §11) in place of ours and the slot kernel
    table_v2: type | None = None  # a V2 table class (docs/contract.md §11) in place of ours and the V2 kernels

    def class_name(self, kind: str) -> str:
        """How reports name the class plug-in of `kind`: as the user named it, else by
        the class's own name."""
        return (self.classes or {}).get(kind) or getattr(self, kind.replace("-", "_")).__name__


def load_kv_kernels(specs: dict[str, str] | None = None) -> KVKernels:
    """The KV kernels `specs` names by kind; ours ("triton") for a kind it does not name."""
    chosen = {kind: (specs or {}).get(kind) or "triton" for kind in KV_KINDS}
    return KVKernels(**{kind: load_kv(kind, spec) for kind, spec in chosen.items()}, specs=chosen)


def load(spec: str, extra: Builtins | None = None) -> SlotMappingFn:
    """Resolve a slot-mapping kernel: a built-in name, `package.module:function` or `file.py:function`."""
    return resolve(spec, {**builtin_kernels(), **(extra or {})}, SLOT_MAPPING)


def load_kv(kind: str, spec: str) -> Callable:
    """Resolve a KV kernel of `kind` ("write", "copy" or "gather") the same way."""
    if kind not in KV_CONTRACTS:
        raise PluginError(f"unknown KV kernel kind {kind!r}: one of {', '.join(KV_KINDS)}")
    return resolve(spec, builtin_kv_kernels(kind), KV_CONTRACTS[kind])


def findable(text: str, names: Builtins | list[str], noun: str) -> KernelSpec:
    """The spec `text`, checked without importing anything: a known built-in name, a
    module spec, or a file spec whose file exists. PluginError names what is wrong."""
    spec = KernelSpec.parse(text, noun)
    if spec.name and spec.name not in names:
        raise PluginError(f"unknown {noun} {text!r}: use one of {', '.join(names)}, "
                          f"MODULE:FUNCTION or path/to/file.py:FUNCTION")
    if spec.file:
        path = Path(spec.file)
        if path.is_dir():
            raise PluginError(f"{noun} file {spec.file} is a folder, not a file")
        if not path.is_file():
            raise PluginError(f"{noun} file {spec.file} does not exist")
    return spec


def resolve(text: str, names: Builtins, contract: Contract) -> Callable:
    fn = found(text, names, contract.noun, "function")
    check_signature(fn, text, contract)
    return fn


def resolve_class(text: str, kind: str) -> type:
    """Resolve a class plug-in of `kind` ("pool"): `ours`, `MODULE:Class` or
    `FILE.py:Class`, checked against its protocol (docs/contract.md §11)."""
    if kind not in CLASS_CONTRACTS:
        raise PluginError(f"unknown class kind {kind!r}: one of {', '.join(CLASS_KINDS)}")
    contract = CLASS_CONTRACTS[kind]
    cls = found(text, builtin_classes(kind), contract.noun, "class")
    check_class(cls, text, contract)
    return cls


def found(text: str, names: Builtins, noun: str, what: str) -> Any:
    """The object `text` names (a built-in's loader called), imported; PluginError
    when it cannot be found or imported. `what`: how a missing one is named."""
    spec = findable(text, names, noun)
    if spec.name:
        return names[spec.name]()
    if spec.file:
        path = Path(spec.file)
        module_spec = importlib.util.spec_from_file_location(f"blocktable_plugin_{path.stem}", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise PluginError(f"importing {spec.file} failed: {type(e).__name__}: {e}") from e
        where = spec.file
    else:
        try:
            module = importlib.import_module(spec.module)
        except ImportError as e:
            raise PluginError(f"cannot import module {spec.module!r}: {e}") from e
        except Exception as e:  # the module was found and raised while importing
            raise PluginError(f"importing module {spec.module!r} failed: {type(e).__name__}: {e}") from e
        where = spec.module
    fn = getattr(module, spec.function, None)
    if fn is None or not callable(fn):
        raise PluginError(f"{where} has no {what} {spec.function!r}" if fn is None else
                          f"{where}: {spec.function!r} is not a {what} (it is a {type(fn).__name__})")
    return fn
