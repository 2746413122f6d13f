"""The reference's KV cache memory, mirrored on the device (docs/design.md, the
lockstep's KV worlds).

A lockstep step changes a few cells of the reference's cache memory: the slots it
wrote and the blocks it copied. Bringing the implementation's whole cache memory back
every step to compare it on the host cost a transfer and a host comparison in
proportion to the cache, whatever the step did. Instead a copy of the reference's
memory lives on the device as well, is sent exactly the cells the reference changed,
and is compared there with the implementation's, bit for bit, every cell (guards and
padding too), into one count that comes back with the step's read-back. Only when the
count is not zero is the implementation's memory fetched whole: the report is then
built on the host from the reference itself, as before.

The host array stays the truth; the mirror is only ever written from it.
"""

from __future__ import annotations

import numpy as np
import torch

from blocktable.device import Backend, upload
from blocktable.kv import bits as device_bits
from blocktable.properties.kv.data import SIGNED

FP8_NAN_LOW_BITS = 0x7F  # e4m3fn's two NaN codes, 0x7F and 0xFF, are the codes whose low seven bits are all set


def view_cells(view: np.ndarray, flat: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """Where `view` (a strided view into the one-dimensional `flat`) lies in it: the flat
    index of its first element and its strides, in elements."""
    item = flat.itemsize
    base = (view.__array_interface__["data"][0] - flat.__array_interface__["data"][0]) // item
    return base, tuple(s // item for s in view.strides)


def entry_cells(view: np.ndarray, flat: np.ndarray, layout: str, block: np.ndarray,
                offset: np.ndarray) -> np.ndarray:
    """The flat indices of every head and dim of entries (block[i], offset[i]) of a
    cache view (`[blocks, Bk, H, D]` for "NHD", `[blocks, H, Bk, D]` for "HND")."""
    base, (s_block, s1, s2, s_dim) = view_cells(view, flat)
    heads, dims = (view.shape[2], view.shape[3]) if layout == "NHD" else (view.shape[1], view.shape[3])
    s_offset, s_head = (s1, s2) if layout == "NHD" else (s2, s1)
    entry = base + block.astype(np.int64) * s_block + offset.astype(np.int64) * s_offset
    inner = (np.arange(heads, dtype=np.int64)[:, None] * s_head + np.arange(dims, dtype=np.int64) * s_dim).reshape(-1)
    return (entry[:, None] + inner).reshape(-1)


def block_cells(view: np.ndarray, flat: np.ndarray, block: np.ndarray) -> np.ndarray:
    """The flat indices of every element of blocks `block` of a cache view."""
    base, strides = view_cells(view, flat)
    inner = np.zeros(1, dtype=np.int64)
    for size, stride in zip(view.shape[1:], strides[1:]):
        inner = (inner[:, None] + np.arange(size, dtype=np.int64) * stride).reshape(-1)
    return (base + block.astype(np.int64)[:, None] * strides[0] + inner).reshape(-1)


class Mirror:
    """The device copy of one host buffer (`host`, the reference's flat cache memory),
    kept equal to it by `send`, and compared with the implementation's buffer by
    `count_differing`. `elements`: where two fp8 NaN codes count as equal (the cells
    that hold a cache element), for a uint8 buffer; None elsewhere."""

    def __init__(self, host: np.ndarray, backend: Backend, elements: np.ndarray | None = None) -> None:
        self.host, self.backend = host, backend
        self.expected = upload(torch.from_numpy(host.view(SIGNED[host.itemsize])), backend)
        self.elements = upload(torch.from_numpy(elements), backend) if elements is not None else None

    def changes(self, cells: np.ndarray) -> np.ndarray | None:
        """The host's current bits at these flat indices, for `apply` to write into the
        mirror: indices and values side by side ([2, n] int64, each cell once; the
        values widened to int64, which every item size's signed bits fit); None for no
        cells."""
        if not len(cells):
            return None
        cells = np.unique(cells)
        return np.stack([cells, self.host.view(SIGNED[self.host.itemsize])[cells].astype(np.int64)])

    def apply(self, changes: torch.Tensor) -> None:
        """`changes(...)`, uploaded (with the step's other arrays), written into the
        mirror, without waiting for the device."""
        self.expected[changes[0]] = changes[1].to(self.expected.dtype)

    def count_differing(self, actual: torch.Tensor, strict_nan: bool) -> torch.Tensor:
        """A one-element int64 device tensor: how many cells of `actual` (the
        implementation's buffer, the host's shape and item size) differ in their bits
        from the mirror, fp8 NaN codes counted equal in `elements` unless `strict_nan`.
        Nothing waits for the device."""
        got = device_bits(actual)  # compared as integers: -0.0 is not 0.0, a NaN equals only its own bits
        differ = got != self.expected
        if self.elements is not None and not strict_nan:
            low = FP8_NAN_LOW_BITS
            differ &= ~(((got & low) == low) & ((self.expected & low) == low) & self.elements)
        return differ.sum(dtype=torch.int64).reshape(1)
