"""A pool class under test (docs/contract.md §11), driven by our sequences.

`DrivenPool` wraps the user's object and gives our `SequenceBlocks` the calls they
make on our own pool (blocktable/pool.py), each turned into the protocol's: a fork's
`share` and a prefix hit's `touch` are the protocol's `touch`; copy-on-write's
`unshare` is a `free` of the one block (its ref stays above 0, so it is not queued).
What the class returns is checked on the way: a wrong answer is the class's finding
(a Discrepancy naming the method), not a crash of the harness.

Keys are the harness's: the chained hash of the block's prefix (blocktable/keys.py),
opaque to the class. The harness remembers each key's group and prefix length, so
that the class's cache map reads as the reference's (group, tokens, blocks) listing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from blocktable.properties.classes.method import call_method
from blocktable.properties.compare import Discrepancy


def _is_id(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Refs:
    """The class's ref counts, read block by block through `ref(block)`, indexed as our
    pool's array is (an id, or a list of ids); the whole array for comparisons."""

    def __init__(self, driven: DrivenPool) -> None:
        self._driven = driven

    def __getitem__(self, index: Any) -> Any:
        if _is_id(index):
            return self._driven.ref_of(int(index))
        return np.array([self._driven.ref_of(int(b)) for b in np.asarray(index).tolist()], dtype=np.int32)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        refs = np.array(self._driven.all_refs(), dtype=np.int32)
        return refs if dtype is None else refs.astype(dtype)


class DrivenPool:
    """A §11 pool object seen as blocktable.pool.BlockPool."""

    def __init__(self, inner: Any, name: str, *, num_blocks: int, null_block: bool, prefix_caching: bool,
                 free_order: str) -> None:
        self.inner = inner
        self.name = name  # how reports name the class
        self.num_blocks = num_blocks
        self.null_block = null_block
        self.prefix_caching = prefix_caching
        self.free_order = free_order
        self.keys: dict[Any, tuple[int, int]] = {}  # key -> (group, prefix length): the harness's record

    @classmethod
    def build(cls, pool_class: type, name: str, *, num_blocks: int, null_block: bool, prefix_caching: bool,
              free_order: str) -> DrivenPool:
        config = dict(num_blocks=num_blocks, null_block=null_block, prefix_caching=prefix_caching,
                      free_order=free_order)
        try:
            inner = pool_class(**config)
        except Exception as error:
            raise Discrepancy("pool class", f"{name}({', '.join(f'{k}={v!r}' for k, v in config.items())}) "
                                            f"raised {type(error).__name__}: {error}") from error
        return cls(inner, name, **config)  # type: ignore[arg-type]

    # -- calls -------------------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        """The class's method (properties/classes/method.py: a refusal passes on, anything
        else it raises is the class's finding)."""
        return call_method(f"pool {method}", lambda: f"{self.name}.{method}{_args(args)}",
                           getattr(self.inner, method), *args)

    def _wrong(self, method: str, args: tuple, got: Any, expected: str) -> Discrepancy:
        return Discrepancy(f"pool {method}", f"{self.name}.{method}{_args(args)} returned {got!r}, expected {expected}")

    def allocate(self, n: int) -> list[int]:
        got = self._call("allocate", n)
        if not isinstance(got, (list, tuple)) or len(got) != n or not all(_is_id(b) for b in got):
            raise self._wrong("allocate", (n,), got, f"a list of {n} block ids")
        return [int(b) for b in got]

    def free(self, ids: Sequence[int]) -> None:
        self._call("free", [int(b) for b in ids])

    def touch(self, ids: Sequence[int]) -> None:
        self._call("touch", [int(b) for b in ids])

    def share(self, ids: Sequence[int]) -> None:
        """A fork: one more table holds each block (in use), through `touch`."""
        self._call("touch", [int(b) for b in ids])

    def unshare(self, block: int) -> None:
        """A writer stops sharing the block it copied away from: a free of that one block."""
        if self.ref_of(block) < 2:
            raise ValueError(f"unshare: block {block} has ref {self.ref_of(block)}; only a shared block is copied")
        self._call("free", [int(block)])

    def cache_block(self, h: bytes, block: int, group: int, length: int) -> None:
        if not self.prefix_caching:
            raise ValueError("cache_block: prefix caching is off")
        self.keys.setdefault(h, (group, length))
        self._call("cache", int(block), h)

    def first_cached(self, h: bytes) -> int | None:
        got = self._call("lookup", h)
        if got is not None and not _is_id(got):
            raise self._wrong("lookup", (h,), got, "a block id or None")
        return None if got is None else int(got)

    def reset_prefix_cache(self) -> bool:
        got = self._call("reset_prefix_cache")
        if not isinstance(got, (bool, np.bool_)):
            raise self._wrong("reset_prefix_cache", (), got, "True or False")
        return bool(got)

    # -- accessors ---------------------------------------------------------------------

    def ref_of(self, block: int) -> int:
        got = self._call("ref", block)
        if not _is_id(got):
            raise self._wrong("ref", (block,), got, "an int")
        return int(got)

    def all_refs(self) -> list[int]:
        """ref(block) for every block, in one pass: the lockstep reads them all after
        every step, and the checks of one call at a time cost 15 times the call
        itself. The same findings as ref_of's, naming the block."""
        ref, block = self.inner.ref, 0

        def read() -> list[Any]:
            nonlocal block
            got = []
            for block in range(self.num_blocks):
                got.append(ref(block))
            return got

        got = call_method("pool ref", lambda: f"{self.name}.ref({block})", read)
        if not all(type(value) is int for value in got):  # the common case, cheaply; else each value
            for block, value in enumerate(got):
                if not _is_id(value):
                    raise self._wrong("ref", (block,), value, "an int")
        return [int(value) for value in got]

    @property
    def ref(self) -> Refs:
        return Refs(self)

    @property
    def num_free(self) -> int:
        got = self._call("num_free")
        if not _is_id(got):
            raise self._wrong("num_free", (), got, "an int")
        return int(got)

    def free_queue(self) -> list[int]:
        got = self._call("free_queue")
        if not isinstance(got, (list, tuple)) or not all(_is_id(b) for b in got):
            raise self._wrong("free_queue", (), got, "a list of block ids, head first")
        return [int(b) for b in got]

    def is_cached(self, block: int) -> bool:
        return any(block in blocks for _, blocks in self._entries())

    def _entries(self) -> list[tuple[Any, list[int]]]:
        got = self._call("cache_map")
        ok = isinstance(got, (list, tuple)) and all(
            isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], (list, tuple))
            and all(_is_id(b) for b in entry[1]) for entry in got)
        if not ok:
            raise self._wrong("cache_map", (), got, "a list of (key, [block ids]) pairs")
        return [(key, [int(b) for b in blocks]) for key, blocks in got]

    def cache_listing(self) -> list[tuple[int, int, list[int]]]:
        """The class's cache map as (group, prefix length, blocks) per key."""
        listing = []
        for key, blocks in self._entries():
            try:
                known = self.keys.get(key)
            except TypeError:  # an unhashable key the harness never gave
                known = None
            if known is None:
                raise Discrepancy("prefix cache map", f"{self.name}.cache_map() lists key {key!r}, which the "
                                                      f"harness never gave to cache()")
            listing.append((*known, blocks))
        return listing


def _args(args: tuple) -> str:
    def show(a: Any) -> str:
        return f"<key {a.hex()[:8]}>" if isinstance(a, bytes) else repr(a)

    return "(" + ", ".join(show(a) for a in args) + ")"


