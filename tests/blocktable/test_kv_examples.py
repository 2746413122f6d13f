"""The example KV plug-ins (examples/torch_kv_*.py) equal the reference of
docs/contract.md §9 on small cases, whole buffers compared: what a third party copying
them starts from is right. They use torch's own fp8 cast and decode, whose NaNs are
encoded differently from the reference's (a negative NaN as 0xFF; a decoded NaN with
the code's payload): the contract lets NaN encodings differ, and only there."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from blocktable.properties.kv.compare import differing
from blocktable.reference import kv as reference
from blocktable.reference.fp8 import float32_to_bfloat16

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODES = [("auto", torch.bfloat16), ("fp8_e4m3", torch.uint8)]


def load(name: str, function: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def to_torch(array: np.ndarray, device) -> torch.Tensor:
    """bf16 (uint16 bits in the reference) back to torch.bfloat16; others as they are."""
    if array.dtype == np.uint16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(array.copy()).to(device)


def bits_of(t: torch.Tensor) -> np.ndarray:
    return t.cpu().contiguous().view(torch.uint8).numpy().reshape(-1)


def host(t: torch.Tensor, like: np.ndarray) -> np.ndarray:
    """A device tensor as an array of `like`'s dtype and shape (bf16 as uint16 bits)."""
    return bits_of(t).view(like.dtype).reshape(like.shape)


def same(expected: np.ndarray, actual: np.ndarray, nans: bool | np.ndarray) -> bool:
    """Bit for bit, NaNs of two encodings equal where `nans` (the contract's allowance)."""
    return not differing(expected, actual, nans)[0].any()


def random_cache(rng, shape, cache_dtype: torch.dtype) -> np.ndarray:
    if cache_dtype == torch.uint8:
        codes = rng.integers(0, 256, shape, dtype=np.uint8)
        codes.reshape(-1)[:8] = [0x7F, 0xFF, 0x00, 0x80, 0x7E, 0xFE, 0x01, 0x81]  # block 0, offset 0: read
        return codes
    return float32_to_bfloat16(rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("mode, cache_dtype", MODES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_write_example(backend, layout, mode, cache_dtype):
    rng = np.random.default_rng(0)
    write = load("torch_kv_write", "write")
    shape = reference.cache_shape(layout, 4, 3, 2, 4)  # 4 blocks of Bk=3, H=2, D=4
    buf = random_cache(rng, (4, 2, *shape[1:]), cache_dtype)  # one tensor: key and value halves
    x = float32_to_bfloat16((rng.standard_normal((7, 2, 4)) * 300).astype(np.float32))  # 2 padding rows
    slots = np.array([11, -1, 0, 4, 5], np.int64)
    kw = dict(layout=layout, kv_cache_dtype=mode, k_scale=0.5, v_scale=2.0)
    device_buf = to_torch(buf, backend.device)
    write(to_torch(x, backend.device), to_torch(x[::-1].copy(), backend.device), device_buf[:, 0], device_buf[:, 1],
          torch.from_numpy(slots).to(backend.device), **kw)
    reference.write(x, x[::-1].copy(), buf[:, 0], buf[:, 1], slots, **kw)
    assert same(buf, host(device_buf, buf), nans=mode == "fp8_e4m3")


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.uint8])
def test_copy_example(backend, cache_dtype):
    rng = np.random.default_rng(1)
    copy_blocks = load("torch_kv_copy", "copy_blocks")
    layers = [random_cache(rng, (6, 3, 2, 4), cache_dtype) for _ in range(4)]
    pairs = np.array([[0, 3], [0, 4], [2, 5]], np.int64)
    tensors = [to_torch(a, backend.device) for a in layers]
    copy_blocks(tensors[:2], tensors[2:], torch.from_numpy(pairs).to(backend.device))
    reference.copy_blocks(layers[:2], layers[2:], pairs)
    for t, a in zip(tensors, layers):
        assert np.array_equal(bits_of(t), a.view(np.uint8).reshape(-1))


@pytest.mark.parametrize("mode, cache_dtype", MODES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_gather_example(backend, layout, mode, cache_dtype):
    rng = np.random.default_rng(2)
    gather = load("torch_kv_gather", "gather")
    shape = reference.cache_shape(layout, 5, 3, 2, 4)
    caches = [random_cache(rng, shape, cache_dtype) for _ in range(2)]
    table = np.array([[4, 1, 99], [0, 99, 99], [2, 3, 0]], np.int32)  # 99: never read
    cu = np.array([0, 5, 5, 12], np.int32)  # request 1 is empty
    out_dtype = np.float32 if mode == "fp8_e4m3" else np.uint16
    outs = [np.full((14, 2, 4), 0x3F80, np.uint16) if out_dtype == np.uint16 else
            np.full((14, 2, 4), -7.0, np.float32) for _ in range(2)]  # two rows past cu[N]
    kw = dict(layout=layout, kv_cache_dtype=mode, k_scale=0.37, v_scale=3.0)
    device_outs = [to_torch(o, backend.device) for o in outs]
    gather(*(to_torch(c, backend.device) for c in caches), torch.from_numpy(table).to(backend.device),
           torch.from_numpy(cu).to(backend.device), *device_outs, **kw)
    reference.gather(*caches, table, cu, *outs, **kw)
    decoded = (np.arange(14) < cu[-1])[:, None, None] if mode == "fp8_e4m3" else False  # rows past cu[N]: exact
    for t, a in zip(device_outs, outs):
        assert same(a, host(t, a), decoded)
    if mode == "fp8_e4m3":  # block 0 offset 0 holds NaN codes, read by request 1: torch's NaNs differ
        assert any(not same(a, host(t, a), False) for t, a in zip(device_outs, outs))
