"""The configuration of one lockstep run: KV-cache groups, DCP, pool and batch
sizes. Plain data, so that a case file can store it as JSON and replay it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from blocktable.reference import GroupLayout
from blocktable.reference.layout import INT32_MAX


@dataclass(frozen=True)
class GroupConfig:
    kv_block_size: int  # K
    kernel_block_size: int  # B
    sharded: bool = True  # False: replicated on every DCP rank (sliding window, Mamba)
    cp_interleave: int = 1  # I


@dataclass(frozen=True)
class KVConfig:
    """The KV caches a world keeps (docs/contract.md §9): every group writes its tokens'
    keys and values through the kernel's slot mappings, copies blocks on write, and
    reads its sequences back with the KV kernels under test. `joint`: the key and value
    caches are views of one `[blocks, 2, ...]` tensor; `pad`: elements of padding after
    each head's D (strided caches), which no kernel may touch."""

    num_heads: int = 1
    head_size: int = 4
    dtype: str = "float16"  # of keys and values: float16 | bfloat16 | float32
    kv_cache_dtype: str = "auto"  # auto | fp8_e4m3
    layout: str = "NHD"  # NHD | HND
    joint: bool = False
    pad: int = 0
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.head_size < 1 or self.pad < 0:
            raise ValueError("num_heads and head_size must be >= 1, pad >= 0")
        for name, value, allowed in (("dtype", self.dtype, ("float16", "bfloat16", "float32")),
                                     ("kv_cache_dtype", self.kv_cache_dtype, ("auto", "fp8_e4m3")),
                                     ("layout", self.layout, ("NHD", "HND"))):
            if value not in allowed:
                raise ValueError(f"kv {name} must be one of {', '.join(allowed)}, got {value!r}")
        if not (self.k_scale > 0 and self.v_scale > 0):
            raise ValueError("k_scale and v_scale must be > 0")

    def describe(self) -> str:
        scales = f" k_scale={self.k_scale:g} v_scale={self.v_scale:g}" if self.kv_cache_dtype != "auto" else ""
        return (f"KV H={self.num_heads} D={self.head_size} {self.dtype} cache {self.kv_cache_dtype} {self.layout}"
                f"{' joint' if self.joint else ''}{f' pad {self.pad}' if self.pad else ''}{scales}")


@dataclass(frozen=True)
class V2Config:
    """A world that keeps vLLM V2's block tables (docs/contract.md §10) beside the V1
    ones, on both sides, one `BlockTables` per DCP rank as each rank's worker holds
    them: the same requests' blocks staged per step, gathered in a permuted batch order
    and mapped to slots for every group in one launch. `slot_mapping_enabled`: per
    group; a group switched off maps no token (its slots are all -1)."""

    slot_mapping_enabled: tuple[bool, ...] = ()

    def enabled(self, num_groups: int) -> list[bool]:
        return list(self.slot_mapping_enabled) if self.slot_mapping_enabled else [True] * num_groups


@dataclass(frozen=True)
class WorldConfig:
    groups: tuple[GroupConfig, ...] = field(default_factory=lambda: (GroupConfig(16, 16),))
    cp_world_size: int = 1  # W, shared by every sharded group
    num_blocks: int = 64  # the pool (shared by all groups, as in vLLM v1)
    null_block: bool = True
    id_offset: int = 0  # table id = pool id + id_offset: ids near 2**31-1 without a huge cache
    max_num_reqs: int = 4
    max_model_len: int = 256
    max_num_batched_tokens: int = 64  # Tmax
    prefix_caching: bool = False  # docs/contract.md §8: requests come with prompts, and share cached blocks
    kv: KVConfig | None = None  # KV caches written, copied and read by the KV kernels under test
    # Prefix-caching worlds only. `fresh_admission`: an add or resume gives the rest of
    # the prompt its fresh blocks in the same call as the hits (as a scheduler admits),
    # not step by step. `vocabulary`: the token id of each symbol a program's prompts
    # are written in (empty: the symbols are the ids, as in worlds saved before).
    fresh_admission: bool = False
    vocabulary: tuple[int, ...] = ()
    v2: V2Config | None = None  # docs/contract.md §10: V2 block tables kept beside the V1 ones
    free_order: str = "tail"  # docs/contract.md §6: where freed blocks join the queue ("tail" or "vllm")

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a world needs at least one KV-cache group")
        for g in self.groups:
            layout = self.layout(g)  # validates K, B, I
            P = layout.kernel_blocks_per_block
            top = (self.id_offset + self.num_blocks - 1) * P + P - 1
            if top > INT32_MAX:
                raise ValueError(f"id_offset {self.id_offset}: kernel block id {top} of group K={g.kv_block_size} "
                                 f"exceeds 2**31-1")
        if self.kv is not None and self.id_offset:
            raise ValueError("a world with KV caches cannot offset its table ids (the caches hold every block)")
        if self.max_num_reqs < 1 or self.max_model_len < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_reqs, max_model_len and max_num_batched_tokens must be >= 1")
        if (self.fresh_admission or self.vocabulary) and not self.prefix_caching:
            raise ValueError("fresh_admission and vocabulary belong to worlds that cache prefixes")
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < INT32_MAX for t in self.vocabulary) \
                or len(set(self.vocabulary)) != len(self.vocabulary):
            raise ValueError(f"vocabulary: distinct token ids in [0, 2**31 - 1) expected, got {list(self.vocabulary)}")
        if self.free_order not in ("tail", "vllm"):
            raise ValueError(f"free_order must be tail or vllm, got {self.free_order!r}")
        if self.v2 is not None:
            flags = self.v2.slot_mapping_enabled
            if flags and (len(flags) != len(self.groups) or any(not isinstance(f, bool) for f in flags)):
                raise ValueError(f"v2 slot_mapping_enabled: one true or false per group, got {list(flags)}")
            # §10 has one interleave for every group: a world's sharded groups must agree.
            interleaves = {g.cp_interleave for g in self.groups if g.sharded and self.cp_world_size > 1}
            if len(interleaves) > 1:
                raise ValueError(f"a V2 world's sharded groups share one cp_interleave, got {sorted(interleaves)}")

    def v2_interleave(self) -> int:
        """The one cp_interleave of a V2 world (1 where no group is sharded over DCP)."""
        return next((g.cp_interleave for g in self.groups if g.sharded and self.cp_world_size > 1), 1)

    def layout(self, g: GroupConfig) -> GroupLayout:
        return GroupLayout(g.kv_block_size, g.kernel_block_size, sharded=g.sharded,
                           cp_world_size=self.cp_world_size, cp_interleave=g.cp_interleave)

    def layouts(self) -> list[GroupLayout]:
        return [self.layout(g) for g in self.groups]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("fresh_admission", "vocabulary", "v2"):  # written only when set: older files stay as they were
            if not data[name]:
                del data[name]
        if data["free_order"] == "tail":
            del data["free_order"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorldConfig:
        data = dict(data)
        data["groups"] = tuple(GroupConfig(**g) for g in data["groups"])
        if data.get("kv") is not None:
            data["kv"] = KVConfig(**data["kv"])
        if "vocabulary" in data:
            data["vocabulary"] = tuple(data["vocabulary"])
        if data.get("v2") is not None:
            data["v2"] = V2Config(tuple(data["v2"].get("slot_mapping_enabled", ())))
        return cls(**data)

    def describe(self) -> str:
        def mode(g: GroupConfig) -> str:
            if not g.sharded:
                return "replicated"
            return f"sharded I={g.cp_interleave}" if self.cp_world_size > 1 else "W=1"

        groups = ", ".join(f"[K={g.kv_block_size} B={g.kernel_block_size} {mode(g)}]" for g in self.groups)
        return (f"groups {groups}; W={self.cp_world_size}; pool {self.num_blocks} blocks"
                f"{' (null block 0)' if self.null_block else ''}"
                f"{f', ids offset by {self.id_offset}' if self.id_offset else ''}; "
                f"{self.max_num_reqs} rows, max_model_len {self.max_model_len}, Tmax {self.max_num_batched_tokens}"
                f"{'; prefix caching' if self.prefix_caching else ''}"
                f"{' (fresh blocks on admission)' if self.fresh_admission else ''}"
                f"{f', token ids {list(self.vocabulary)}' if self.vocabulary else ''}"
                f"{'; freed blocks to the head (vLLM order)' if self.free_order == 'vllm' else ''}"
                f"{'; ' + self.kv.describe() if self.kv else ''}"
                f"{'; ' + self._v2_text() if self.v2 is not None else ''}")

    def _v2_text(self) -> str:
        assert self.v2 is not None
        off = [g for g, on in enumerate(self.v2.enabled(len(self.groups))) if not on]
        return "V2 block tables" + (f" (slot mapping off in group{'s' if len(off) > 1 else ''} "
                                    f"{', '.join(map(str, off))})" if off else "")
