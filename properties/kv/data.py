"""The KV path's data, as every room of the harness holds it (docs/contract.md §9).

Arrays follow blocktable.reference.kv's conventions: float16 and float32 as they are,
bfloat16 as uint16 bit patterns (numpy has no bfloat16), fp8 e4m3 caches as uint8
codes. One name per dtype ("float16", "bfloat16", "float32", "uint8", "int32",
"int64") maps to its host and device types; `mix` is the one splitmix64 finalizer
every pseudo-random buffer comes from, so that a seed gives the same bits on every
machine and numpy version.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from blocktable.device import Backend, upload
from blocktable.properties.world import KVConfig

HOST = {"float16": np.float16, "bfloat16": np.uint16, "float32": np.float32, "uint8": np.uint8,
        "int32": np.int32, "int64": np.int64}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "uint8": torch.uint8,
         "int32": torch.int32, "int64": torch.int64}
# The integer types a flat buffer holds an item size's bits in: signed where torch
# has no unsigned type of that width.
SIGNED = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: well-spread 64-bit hashes of distinct inputs."""
    x = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def pseudo_random_bits(seed: int, salt: str, count: int) -> np.ndarray:
    """`count` uint64s of splitmix64 over (seed, salt), so that a case file keeps a
    buffer's contents as one seed."""
    with np.errstate(over="ignore"):
        start = np.uint64((seed * 0x9E3779B1 + zlib.crc32(salt.encode())) % 2**64) * np.uint64(0x9E3779B97F4A7C15)
        return mix(np.arange(count, dtype=np.uint64) + start)


def token_data(values: np.ndarray, kv: KVConfig, which: int) -> np.ndarray:
    """[T, H, D] keys (which=0) or values (1) of tokens with these values, in the
    reference's representation of kv.dtype (bfloat16 as uint16 bits). For a bit-copy
    cache, any bit pattern (NaNs with payloads too); for fp8, magnitudes from 2**-14
    to 2**9 times the scale's range (subnormal codes to saturation) and, one element
    in 16, a special value (±0, ±inf, NaN of either sign)."""
    H, D = kv.num_heads, kv.head_size
    cells = np.arange(H * D, dtype=np.uint64).reshape(1, H, D)
    with np.errstate(over="ignore"):
        seed = values.astype(np.int64).view(np.uint64)[:, None, None] * np.uint64(0x9E3779B97F4A7C15)
        h = mix(seed + cells * np.uint64(2) + np.uint64(which))
    if kv.kv_cache_dtype == "auto":
        size = np.dtype(HOST[kv.dtype]).itemsize
        return (h & np.uint64((1 << (8 * size)) - 1)).astype(UNSIGNED[size]).view(HOST[kv.dtype])
    exponent = (h >> np.uint64(32)) % np.uint64(24) + np.uint64(127 - 14)
    f32 = ((h >> np.uint64(63)) << np.uint64(31)) | (exponent << np.uint64(23)) | (h & np.uint64(0x7FFFFF))
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x43E00000, 0x3B000000,
                        0x3A800000], dtype=np.uint64)  # ±0, ±inf, ±NaN, 448, 2**-9, 2**-10 (an fp8 midpoint)
    pick = (h >> np.uint64(44)) % np.uint64(len(special))
    f32 = np.where((h >> np.uint64(40)) % np.uint64(16) == 0, special[pick], f32)
    x = f32.astype(np.uint32).view(np.float32)
    if kv.dtype == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    if kv.dtype == "bfloat16":
        return (x.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return x


def for_upload(host: np.ndarray, dtype: str) -> np.ndarray:
    """A host array in the reference's representation, as torch can take it from numpy
    (bfloat16's bits as int16); `received` makes the upload a tensor of `dtype` again."""
    return host.view(np.int16) if dtype == "bfloat16" else host


def received(sent: torch.Tensor, dtype: str) -> torch.Tensor:
    """An upload of `for_upload(host, dtype)` as a device tensor of `dtype`."""
    return sent.view(torch.bfloat16) if dtype == "bfloat16" else sent


def to_device(host: np.ndarray, dtype: str, backend: Backend) -> torch.Tensor:
    """A host array in the reference's representation as a device tensor of `dtype`."""
    return received(upload(torch.from_numpy(np.ascontiguousarray(for_upload(host, dtype))), backend), dtype)


def filled(shape: tuple[int, ...], dtype: str, byte: int, backend: Backend) -> torch.Tensor:
    """A device tensor of `shape` and `dtype` whose every byte is `byte`, made on the
    device (`shape` of one dimension or more): the bytes of an upload of the same fill,
    without the upload."""
    made = torch.full((*shape[:-1], shape[-1] * TORCH[dtype].itemsize), byte, dtype=torch.uint8, device=backend.device)
    return made if dtype == "uint8" else made.view(TORCH[dtype])  # the last dimension's bytes as its elements


def fetchable(t: torch.Tensor) -> torch.Tensor:
    """A tensor blocktable.device.to_host can bring back (numpy has no bfloat16)."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t
