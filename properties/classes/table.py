"""A V1 table class under test (docs/contract.md §11), driven by the lockstep.

`DrivenTables` builds one object of the user's class per DCP rank (a rank's engine
process keeps its own, with the same rows) and gives the lockstep the calls it makes
on our multi-group table (blocktable/groups.py): every row operation and commit goes
to every rank's object; each group is read back through the protocol's accessors
(`GroupView`, seen as our BlockTable). The slot mappings are the class's own
(`compute_slot_mapping`, then `slot_mapping(g)`), compared whole on every rank.

What the class returns is checked on the way: a wrong type or shape, an exception
that is not a refusal, or ranks that disagree about a refusal is the class's finding
(a Discrepancy naming the method), not a crash of the harness. The CUDA-graph padding
is the runner's (vLLM's runner fills the rows of the persistent device buffer), so
the harness pads the tensor `device_rows(g)` returns: it must be the buffer itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from blocktable.device import Backend, upload
from blocktable.properties.classes.method import call_method
from blocktable.properties.compare import Discrepancy, assert_arrays_equal

NULL_BLOCK_ID = 0  # what padded rows hold (docs/contract.md §5)


class DrivenTables:
    """The class's objects, one per rank, seen as blocktable.groups.MultiGroupBlockTable."""

    def __init__(self, objects: list[Any], name: str, num_groups: int, max_num_reqs: int,
                 max_tokens: int, backend: Backend) -> None:
        self.objects = objects
        self.name = name
        self.max_num_reqs = max_num_reqs
        self.max_tokens = max_tokens
        self.backend = backend
        self.device = backend.device
        self.ranks = [[GroupView(self, R, g) for g in range(num_groups)] for R in range(len(objects))]
        self.tables = self.ranks[0]

    @classmethod
    def build(cls, table_class: type, name: str, world: Any, backend: Backend) -> DrivenTables:
        """One object per DCP rank when some group is sharded, else one."""
        groups = world.groups
        ranks = world.cp_world_size if any(g.sharded for g in groups) else 1
        objects = []
        for R in range(ranks):
            config = dict(max_num_reqs=world.max_num_reqs, max_model_len=world.max_model_len,
                          max_num_batched_tokens=world.max_num_batched_tokens, device=backend.device,
                          block_sizes=[g.kv_block_size for g in groups],
                          kernel_block_sizes=[g.kernel_block_size for g in groups],
                          sharded=[g.sharded for g in groups], cp_world_size=world.cp_world_size, cp_rank=R,
                          cp_interleave=[g.cp_interleave for g in groups])
            try:
                objects.append(table_class(**config))
            except Exception as error:
                shown = ", ".join(f"{k}={v!r}" for k, v in config.items())
                raise Discrepancy("table class", f"{name}({shown}) raised {type(error).__name__}: {error}") from error
        return cls(objects, name, len(groups), world.max_num_reqs, world.max_num_batched_tokens, backend)

    def __getitem__(self, group: int) -> GroupView:
        return self.tables[group]

    def probe_refusals(self, reference: Any) -> None:
        """The row indices a program never passes (past the last row, negative: each
        argument of each row operation) and commit counts out of [0, max_num_reqs], on
        new objects: each call must raise ValueError and
        leave every accessor as the reference's new table holds it (all zeros). A
        table indexing numpy with a negative row would write the last row instead."""
        n = self.max_num_reqs
        none: tuple[list[int], ...] = tuple([] for _ in self.tables)
        bad = [("add_row", (none, n)), ("add_row", (none, -1)), ("append_row", (none, n)), ("append_row", (none, -1)),
               ("clear_row", (n,)), ("clear_row", (-1,)), ("move_row", (0, n)), ("move_row", (n, 0)),
               ("move_row", (-1, 0)), ("move_row", (0, -1)), ("swap_row", (0, n)), ("swap_row", (n, 0)),
               ("swap_row", (-1, 0)), ("swap_row", (0, -1)), ("commit_block_table", (n + 1,)),
               ("commit_block_table", (-1,))]
        for method, args in bad:
            for R in range(len(self.objects)):
                try:
                    self.call(R, method, *args)
                except ValueError:
                    continue
                except TypeError as error:
                    raise Discrepancy(f"table {method}", f"{self._named(R, method, args)} raised {error!r}: a row "
                                                         f"or count out of range is a ValueError "
                                                         f"(docs/contract.md §3)") from error
                raise Discrepancy(f"table {method}", f"{self._named(R, method, args)} was accepted: a row or count "
                                                     f"out of range must raise ValueError (docs/contract.md §3)")
        for views in self.ranks:
            for g, view in enumerate(views):
                for part, expected, got in (("table host rows", reference[g].host, view.host),
                                            ("table row counts", reference[g].count, view.count),
                                            ("table device rows", reference[g].device, view.device_rows())):
                    try:
                        assert_arrays_equal(part, expected, got, group=g)
                    except Discrepancy as error:
                        error.notes.append(f"after calls refused with a row out of range on a new table "
                                           f"(the object for cp_rank {view.R})")
                        raise

    def __len__(self) -> int:
        return len(self.tables)

    # -- calls -------------------------------------------------------------------------

    def call(self, R: int, method: str, *args: Any) -> Any:
        """Rank R's object's method (properties/classes/method.py: a refusal passes on,
        anything else it raises is the class's finding)."""
        return call_method(f"table {method}", lambda: self._named(R, method, args),
                           getattr(self.objects[R], method), *args)

    def _named(self, R: int, method: str, args: tuple) -> str:
        rank = f" (the object for cp_rank {R})" if len(self.objects) > 1 else ""
        return f"{self.name}.{method}({', '.join(map(repr, args))}){rank}"

    def _every_rank(self, method: str, *args: Any) -> None:
        """The call on every rank's object: all refuse or none does."""
        for R in range(len(self.objects)):
            try:
                self.call(R, method, *args)
            except (ValueError, TypeError) as error:
                if R == 0:
                    raise
                raise Discrepancy(f"table {method}", f"{self._named(R, method, args)} raised {error!r}, where "
                                                     f"the object for cp_rank 0 accepted the call") from error

    def add_row(self, ids_per_group: Sequence[Sequence[int]], row: int) -> None:
        self._every_rank("add_row", _lists(ids_per_group), row)

    def append_row(self, ids_per_group: Sequence[Sequence[int]], row: int) -> None:
        self._every_rank("append_row", _lists(ids_per_group), row)

    def clear_row(self, row: int) -> None:
        self._every_rank("clear_row", row)

    def move_row(self, src: int, dst: int) -> None:
        self._every_rank("move_row", src, dst)

    def swap_row(self, a: int, b: int) -> None:
        self._every_rank("swap_row", a, b)

    def commit(self, n: int) -> None:
        self._every_rank("commit_block_table", n)

    def clear(self) -> None:
        self._every_rank("clear")

    def slot_calls(self, qsl: np.ndarray, positions: np.ndarray, N: int, ranks: list[int]) -> list[ClassSlotCall]:
        """Every rank's `compute_slot_mapping` on the step's inputs (sent once, handed
        to every object), then each group's slot buffers of the ranks it keeps
        (`ranks[g]`: the group's DCP world, 1 when it is not sharded)."""
        qsl_sent = upload(torch.from_numpy(qsl), self.backend)
        positions_sent = upload(torch.from_numpy(positions), self.backend)
        for R in range(len(self.objects)):
            self.call(R, "compute_slot_mapping", N, qsl_sent, positions_sent)
        return [ClassSlotCall(self, g, [self.slot_buffer(R, g) for R in range(world)], qsl, positions,
                              qsl_sent, positions_sent) for g, world in enumerate(ranks)]

    def slot_buffer(self, R: int, g: int) -> torch.Tensor:
        got = self.call(R, "slot_mapping", g)
        if not (isinstance(got, torch.Tensor) and got.dtype == torch.int64 and tuple(got.shape) == (self.max_tokens,)
                and got.device == self.device):
            raise Discrepancy("table slot_mapping", f"{self._named(R, 'slot_mapping', (g,))} returned "
                                                    f"{described(got)}, expected an int64 tensor of shape "
                                                    f"({self.max_tokens},) on {self.device}", group=g)
        return got


class GroupView:
    """Group g of rank R's object, read through the protocol's accessors each time,
    seen as blocktable.table.BlockTable."""

    def __init__(self, driven: DrivenTables, R: int, g: int) -> None:
        self.driven, self.R, self.g = driven, R, g

    def _checked(self, method: str, ok: bool, got: Any, expected: str) -> Any:
        if not ok:
            raise Discrepancy(f"table {method}", f"{self.driven._named(self.R, method, (self.g,))} returned "
                                                 f"{described(got)}, expected {expected}", group=self.g)
        return got

    @property
    def host(self) -> np.ndarray:
        got = self.driven.call(self.R, "host_rows", self.g)
        return self._checked("host_rows", isinstance(got, np.ndarray) and got.dtype == np.int32 and got.ndim == 2,
                             got, "an int32 numpy array [max_num_reqs, width]")

    @property
    def count(self) -> np.ndarray:
        got = self.driven.call(self.R, "counts", self.g)
        array = np.asarray(got) if isinstance(got, (np.ndarray, list, tuple)) else None
        self._checked("counts", array is not None and array.dtype.kind in "iu"
                      and array.shape == (self.driven.max_num_reqs,), got,
                      f"ints [max_num_reqs = {self.driven.max_num_reqs}]")
        assert array is not None  # checked
        return array.astype(np.int32)

    @property
    def width(self) -> int:
        return int(self.host.shape[1])

    @property
    def device_tensor(self) -> torch.Tensor:
        got = self.driven.call(self.R, "device_rows", self.g)
        return self._checked("device_rows", isinstance(got, torch.Tensor) and got.dtype == torch.int32
                             and got.dim() == 2 and got.device == self.driven.device, got,
                             f"an int32 tensor [max_num_reqs, width] on {self.driven.device}")

    def device_rows(self) -> np.ndarray:
        return self.device_tensor.cpu().numpy()

    def pad_for_cuda_graph(self, num_reqs: int, num_reqs_padded: int) -> torch.Tensor:
        """The runner's padding, on the class's own device buffer; through rank 0's
        view (the lockstep's), every rank's runner pads its own object's."""
        if self.R == 0:
            for views in self.driven.ranks[1:]:
                views[self.g].pad_for_cuda_graph(num_reqs, num_reqs_padded)
        rows = self.device_tensor
        rows[num_reqs:num_reqs_padded].fill_(NULL_BLOCK_ID)
        if self.device_tensor.data_ptr() != rows.data_ptr():
            raise Discrepancy("table device_rows", f"{self.driven._named(self.R, 'device_rows', (self.g,))} "
                                                   f"returned a new tensor each call: the runner pads the table's "
                                                   f"own device buffer for CUDA graphs, so device_rows must "
                                                   f"return that buffer", group=self.g)
        return rows[:num_reqs_padded]


class ClassSlotCall:
    """Group g's slot buffers after the class's `compute_slot_mapping`, as the lockstep
    checks a kernel's call: `outputs` [ranks, Tmax] (a copy, taken before the next
    step overwrites the buffers), `readback` what `check` compares, in one tensor."""

    def __init__(self, driven: DrivenTables, g: int, buffers: list[torch.Tensor], qsl: np.ndarray,
                 positions: np.ndarray, qsl_sent: torch.Tensor, positions_sent: torch.Tensor) -> None:
        self.driven, self.group = driven, g
        self.outputs = torch.stack(buffers)
        self.qsl, self.positions = qsl, positions
        self._back = torch.cat([self.outputs.reshape(-1), qsl_sent.to(torch.int64), positions_sent])

    def readback(self) -> list[torch.Tensor]:
        return [self._back]

    def check(self, back: list[np.ndarray] | None = None) -> np.ndarray:
        """The inputs as they were handed; returns the slot mappings [ranks, Tmax]."""
        handed = back[0] if back is not None else self._back.cpu().numpy()
        n = self.outputs.numel()
        qsl, positions = handed[n:n + len(self.qsl)], handed[n + len(self.qsl):]
        for name, sent, now in (("query_start_loc", self.qsl, qsl), ("positions", self.positions, positions)):
            if not np.array_equal(sent.astype(np.int64), now):
                i = int(np.flatnonzero(sent.astype(np.int64) != now)[0])
                raise Discrepancy("slot mapping", f"{self.driven.name}.compute_slot_mapping changed its input "
                                                  f"{name} at index {i}: {int(sent[i])} became {int(now[i])}",
                                  group=self.group)
        return handed[:n].reshape(self.outputs.shape)


def _lists(ids_per_group: Sequence[Sequence[int]]) -> tuple[list[int], ...]:
    return tuple([int(b) for b in ids] for ids in ids_per_group)


def described(got: Any) -> str:
    if isinstance(got, torch.Tensor):
        return f"a {got.dtype} tensor of shape {tuple(got.shape)} on {got.device}"
    if isinstance(got, np.ndarray):
        return f"a numpy {got.dtype} array of shape {got.shape}"
    return f"{type(got).__name__} {got!r}"[:120]
