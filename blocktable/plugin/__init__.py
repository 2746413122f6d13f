"""Plug-ins: the functions under test, ours or a third party's, named by a
`KernelSpec` (spec.py), held to the contract of their kind (contract.py) and found
and loaded (load.py). docs/plugins.md is the user's page."""

from blocktable.plugin.classes import (
                                        CLASS_CONTRACTS,
                                        CLASS_KINDS,
                                        FREE_ORDERS,
                                        attribute,
                                        builtin_classes,
                                        declared_free_orders,
                                        declared_uniform_groups,
                                        free_order_refusal,
                                        replaces_slot_kernel,
                                        world_refusal,
)
from blocktable.plugin.contract import (
                                        KEYWORDS,
                                        KV_CONTRACTS,
                                        KV_KEYWORDS,
                                        KV_KINDS,
                                        SLOT_MAPPING,
                                        V2_CONTRACTS,
                                        V2_KINDS,
                                        Contract,
                                        SlotMappingFn,
                                        check_signature,
)
from blocktable.plugin.load import (
                                        KVKernels,
                                        Plugins,
                                        V2Plugins,
                                        builtin_kernels,
                                        builtin_kv_kernels,
                                        builtin_v2_kernels,
                                        findable,
                                        load,
                                        load_kv,
                                        load_kv_kernels,
                                        load_v2,
                                        load_v2_kernels,
                                        resolve,
                                        resolve_class,
)
from blocktable.plugin.spec import KernelSpec, PluginError

__all__ = [
    "CLASS_CONTRACTS", "CLASS_KINDS", "FREE_ORDERS", "attribute", "builtin_classes", "declared_free_orders",
    "declared_uniform_groups", "free_order_refusal", "replaces_slot_kernel",
    "world_refusal",
    "resolve_class",
    "KEYWORDS", "KV_CONTRACTS", "KV_KEYWORDS", "KV_KINDS", "SLOT_MAPPING", "V2_CONTRACTS", "V2_KINDS", "Contract",
    "KVKernels", "KernelSpec", "PluginError", "Plugins", "SlotMappingFn", "V2Plugins", "builtin_kernels",
    "builtin_kv_kernels", "builtin_v2_kernels", "check_signature", "findable", "load", "load_kv",
    "load_kv_kernels", "load_v2", "load_v2_kernels", "resolve",
]
