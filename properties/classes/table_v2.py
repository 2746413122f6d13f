"""A V2 table class under test (docs/contract.md §11), driven by the lockstep's V2
worlds (lockstep/v2.py) in place of our `BlockTables`, one object per DCP rank.

`DrivenV2` gives the V2 world the calls and the state it reads on ours: §10's four
operations (through properties/classes/method.py: a refusal passes on, anything else
is the class's finding) and §10.1's parts, each read through the protocol's accessor
and checked for its type, dtype, shape and device before anything compares it.
The staged writes are the class's own business: only what they do (the persistent
rows and device counts after `apply_staged_writes`) is compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from blocktable.properties.classes.method import call_method
from blocktable.properties.classes.table import described
from blocktable.properties.compare import Discrepancy


class DrivenV2:
    """A §11 V2 table object seen as blocktable.v2.BlockTables."""

    def __init__(self, inner: Any, name: str, rank: int | None, widths: Sequence[int], max_num_reqs: int,
                 max_tokens: int, device: torch.device) -> None:
        self.inner, self.name, self.rank = inner, name, rank
        self.widths, self.max_num_reqs, self.max_tokens, self.device = list(widths), max_num_reqs, max_tokens, device
        self.num_groups = len(self.widths)

    @classmethod
    def build(cls, table_class: type, name: str, rank: int | None, config: dict[str, Any], widths: Sequence[int],
              device: torch.device) -> DrivenV2:
        try:
            inner = table_class(**config, device=device)
        except Exception as error:
            shown = ", ".join(f"{k}={v!r}" for k, v in config.items())
            raise Discrepancy("V2 table class", f"{name}({shown}) raised {type(error).__name__}: {error}",
                              rank=rank) from error
        return cls(inner, name, rank, widths, config["max_num_reqs"], config["max_num_batched_tokens"], device)

    def _call(self, method: str, *args: Any) -> Any:
        shown = ", ".join(repr(a) if not isinstance(a, torch.Tensor) else described(a) for a in args)
        return call_method(f"V2 {method}", lambda: f"{self.name}.{method}({shown})", getattr(self.inner, method), *args)

    def _checked(self, method: str, got: Any, dtype: torch.dtype, shape: tuple[int, ...], *args: Any) -> torch.Tensor:
        if not (isinstance(got, torch.Tensor) and got.dtype == dtype and tuple(got.shape) == shape
                and got.device == self.device):
            raise Discrepancy(f"V2 {method}", f"{self.name}.{method}({', '.join(map(repr, args))}) returned "
                                              f"{described(got)}, expected a {dtype} tensor of shape {shape} on "
                                              f"{self.device}", rank=self.rank)
        return got

    # -- §10's operations ------------------------------------------------------------------

    def append_block_ids(self, r: int, new_block_ids: Sequence[Sequence[int]], overwrite: bool) -> None:
        self._call("append_block_ids", int(r), [[int(b) for b in ids] for ids in new_block_ids], bool(overwrite))

    def apply_staged_writes(self) -> None:
        self._call("apply_staged_writes")

    def gather_block_tables(self, idx_mapping: torch.Tensor, num_reqs_padded: int) -> tuple[torch.Tensor, ...]:
        got = self._call("gather_block_tables", idx_mapping, num_reqs_padded)
        if not (isinstance(got, (tuple, list)) and len(got) == self.num_groups
                and all(isinstance(t, torch.Tensor) for t in got)):
            raise Discrepancy("V2 gather_block_tables", f"{self.name}.gather_block_tables returned {described(got)}, "
                                                        f"expected one tensor per group ({self.num_groups})",
                              rank=self.rank)
        return tuple(got)

    def compute_slot_mappings(self, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor, positions: torch.Tensor,
                              num_tokens_padded: int) -> torch.Tensor:
        got = self._call("compute_slot_mappings", idx_mapping, query_start_loc, positions, num_tokens_padded)
        if not isinstance(got, torch.Tensor):
            raise Discrepancy("V2 compute_slot_mappings", f"{self.name}.compute_slot_mappings returned "
                                                          f"{described(got)}, expected a tensor", rank=self.rank)
        return got

    # -- §10.1's state, read through the accessors -------------------------------------------

    @property
    def cnt(self) -> np.ndarray:
        got = self._call("host_counts")
        if not (isinstance(got, np.ndarray) and got.dtype == np.int32
                and got.shape == (self.num_groups, self.max_num_reqs)):
            raise Discrepancy("V2 host_counts", f"{self.name}.host_counts() returned {described(got)}, expected an "
                                                f"int32 numpy array of shape ({self.num_groups}, {self.max_num_reqs})",
                              rank=self.rank)
        return got

    @property
    def cnt_dev(self) -> torch.Tensor:
        return self._checked("device_counts", self._call("device_counts"), torch.int32,
                             (self.num_groups, self.max_num_reqs))

    @property
    def rows(self) -> list[torch.Tensor]:
        return [self._checked("persistent_rows", self._call("persistent_rows", g), torch.int32,
                              (self.max_num_reqs, w), g) for g, w in enumerate(self.widths)]

    @property
    def inp(self) -> list[torch.Tensor]:
        return [self._checked("input_table", self._call("input_table", g), torch.int32,
                              (self.max_num_reqs, w), g) for g, w in enumerate(self.widths)]

    @property
    def slots(self) -> torch.Tensor:
        return self._checked("slot_mappings", self._call("slot_mappings"), torch.int64,
                             (self.num_groups, self.max_tokens))
