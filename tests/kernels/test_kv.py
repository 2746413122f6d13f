"""Our KV-path Triton kernels (blocktable.kv.write, copy_blocks, gather) and the
torch-native versions against the numpy reference of docs/contract.md §9, bit for bit
over whole buffers: every cache, key and output is a view into a larger poisoned
tensor, and the whole of that tensor is compared, so a stray write anywhere (a
padding row, a slot -1, the other cache of a shared tensor, a tail row) shows.

Both layouts; the four cache dtypes (float16, bfloat16, float32: a bit copy of random
bits, NaN payloads included; fp8 e4m3: encoded from values at every boundary); caches
that are contiguous, views of one [num_blocks, 2, ...] tensor, or padded and
transposed in memory; head sizes and block sizes that are not powers of two; key
rows past n; negative slots; empty requests. The bad-input rules are in
tests/blocktable/test_kv.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from blocktable import kv, kv_torch
from blocktable.checks import data_checks
from blocktable.kernels.fp8 import e4m3_decode, e4m3_encode, quantize
from blocktable.reference import kv as reference
from blocktable.reference.fp8 import MAGNITUDES, bfloat16_to_float32, decode_e4m3, encode_e4m3, float32_to_bfloat16

WRITES = {"triton": kv.write, "torch": kv_torch.write_torch}
COPIES = {"triton": kv.copy_blocks, "torch": kv_torch.copy_blocks_torch}
GATHERS = {"triton": kv.gather, "torch": kv_torch.gather_torch}
# cache dtype -> (torch dtype of the key, of the cache, kv_cache_dtype)
DTYPES = {"float16": (torch.float16, torch.float16, "auto"), "bfloat16": (torch.bfloat16, torch.bfloat16, "auto"),
          "float32": (torch.float32, torch.float32, "auto"), "fp8": (torch.bfloat16, torch.uint8, "fp8_e4m3")}
NUMPY = {torch.float16: np.float16, torch.bfloat16: np.uint16, torch.float32: np.float32, torch.uint8: np.uint8}
KINDS = ["contiguous", "one-tensor", "padded-transposed"]
# Contiguous tensors whose strides are all multiples of 16 (D = 16): the kernels'
# aligned compilation; and the same with the value cache one element into its
# memory, which sends them to the unaligned one (blocktable.kernels.kv says why).
ALIGNED_KINDS = ["aligned", "one-pointer-shifted"]


# ---- buffers and their numpy mirrors --------------------------------------------------

def to_torch(array: np.ndarray, dtype: torch.dtype, device) -> torch.Tensor:
    """A tensor of `dtype` holding the array's bits (bf16 from uint16)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(array.copy()).to(device)


@dataclass
class Buffer:
    """A poisoned contiguous tensor and a numpy copy of it (bf16 as uint16 bits);
    views taken of the tensor are mirrored onto the copy, so the device call and the
    reference write through the same shapes and strides into separate memory."""

    tensor: torch.Tensor
    array: np.ndarray

    @classmethod
    def poisoned(cls, shape, dtype: torch.dtype, rng: np.random.Generator, device) -> Buffer:
        """Random bits: NaN payloads, infinities and subnormals for the float types."""
        size = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
        array = rng.integers(0, 256, size=size, dtype=np.uint8).view(NUMPY[dtype]).reshape(shape)
        return cls(to_torch(array, dtype, device), array)

    def reload(self) -> None:
        """Send the array's contents (after the test set some values) to the tensor."""
        self.tensor.copy_(to_torch(self.array, self.tensor.dtype, self.tensor.device))

    def mirror(self, view: torch.Tensor) -> np.ndarray:
        offset = view.storage_offset() - self.tensor.storage_offset()
        item = self.array.itemsize
        return np.lib.stride_tricks.as_strided(self.array.reshape(-1)[offset:], shape=tuple(view.shape),
                                               strides=tuple(s * item for s in view.stride()))

    def matches(self) -> bool:
        got = kv.bits(self.tensor).cpu().numpy().view(np.uint8)
        return np.array_equal(got, self.array.view(np.uint8))


def cache_views(kind: str, layout: str, sizes: tuple[int, int, int, int], dtype: torch.dtype,
                rng: np.random.Generator, device) -> tuple[list[Buffer], torch.Tensor, torch.Tensor]:
    """(buffers, key_cache, value_cache) of logical shape cache_shape(layout, *sizes)."""
    num_blocks, Bk, H, D = sizes
    shape = reference.cache_shape(layout, num_blocks, Bk, H, D)
    if kind in ("contiguous", "aligned"):
        bufs = [Buffer.poisoned(shape, dtype, rng, device) for _ in range(2)]
        return bufs, bufs[0].tensor, bufs[1].tensor
    if kind == "one-pointer-shifted":
        bufs = [Buffer.poisoned(shape, dtype, rng, device), Buffer.poisoned((int(np.prod(shape)) + 1,), dtype, rng,
                                                                            device)]
        return bufs, bufs[0].tensor, bufs[1].tensor[1:].view(shape)
    if kind == "one-tensor":
        buf = Buffer.poisoned((num_blocks, 2, *shape[1:]), dtype, rng, device)
        return [buf], buf.tensor[:, 0], buf.tensor[:, 1]
    # Key cache: a slice of a larger tensor, padded on every axis. Value cache: stored
    # with axes 1 and 2 swapped (the other layout's memory order), then permuted back.
    padded = Buffer.poisoned((shape[0] + 1, shape[1] + 1, shape[2] + 2, D + 3), dtype, rng, device)
    swapped = Buffer.poisoned((shape[0], shape[2], shape[1], D), dtype, rng, device)
    return ([padded, swapped], padded.tensor[1:, 1:shape[1] + 1, 2:, 1:D + 1],
            swapped.tensor.permute(0, 2, 1, 3))


def token_views(n: int, H: int, D: int, dtype: torch.dtype, values: np.ndarray | None, rng, device,
                contiguous: bool = False):
    """(buffers, key, value): [n + 3, H, D] each (three padding rows); the key a slice
    of a wider tensor, the value a transposed one, unless `contiguous`."""
    if contiguous:
        bufs = [Buffer.poisoned((n + 3, H, D), dtype, rng, device) for _ in range(2)]
        if values is not None:
            for buf, v in zip(bufs, values):
                buf.array[...] = v
                buf.reload()
        return bufs, bufs[0].tensor, bufs[1].tensor
    key_buf = Buffer.poisoned((n + 3, H, D + 2), dtype, rng, device)
    value_buf = Buffer.poisoned((H, n + 3, D), dtype, rng, device)
    if values is not None:  # fp8 inputs: real values rather than random bits
        key_buf.array[:, :, :D] = values[0]
        value_buf.array[...] = values[1].transpose(1, 0, 2)
        key_buf.reload()
        value_buf.reload()
    return [key_buf, value_buf], key_buf.tensor[:, :, :D], value_buf.tensor.permute(1, 0, 2)


def interesting_floats(shape, rng) -> np.ndarray:
    """float32 values for fp8: random magnitudes from 1e-5 to 1e4 (subnormal codes to
    saturation), code midpoints, and the special values, all with both signs."""
    count = int(np.prod(shape))
    x = (rng.standard_normal(count) * 10.0 ** rng.uniform(-5, 4, count)).astype(np.float32)
    mid = ((MAGNITUDES[:-1] + MAGNITUDES[1:]) / 2).astype(np.float32)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 448, 464, 465, -480, 1e-9, 2.0**-10],
                       np.float32)
    extra = np.concatenate([special, rng.choice(mid, 40) * rng.choice([-1, 1], 40).astype(np.float32)])
    x[:min(count, len(extra))] = extra[:count]
    return rng.permutation(x).reshape(shape)


def as_dtype(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float32 values in the reference's representation of `dtype` (bf16: uint16 bits)."""
    if dtype == torch.bfloat16:
        return float32_to_bfloat16(x)
    return x.astype(NUMPY[dtype])


def small_tiles(impl: str, tiles: str):
    """Force tiles of 4 tokens and 2 heads on our kernels: several programs, a partial
    last tile, and (with H = 3) a partial last group of heads."""
    if impl == "triton" and tiles == "small":
        return mock.patch.object(kv, "launch_tiles", lambda backend, num_heads, head_size: (4, 2, 1))
    return mock.patch.object(kv, "launch_tiles", kv.launch_tiles)


# ---- write --------------------------------------------------------------------------

def run_write(impl: str, layout: str, dtype_name: str, kind: str, device, seed: int = 0, tiles: str = "default",
              key_dtype: torch.dtype | None = None, scales: tuple[float, float] = (0.37, 3.0)) -> None:
    rng = np.random.default_rng(seed)
    x_dtype, cache_dtype, kv_cache_dtype = DTYPES[dtype_name]
    x_dtype = key_dtype or x_dtype
    sizes = {"padded-transposed": (5, 3, 3, 5), "aligned": (5, 4, 2, 16),
             "one-pointer-shifted": (5, 4, 2, 16)}.get(kind, (5, 4, 2, 8))  # (num_blocks, Bk, H, D)
    num_blocks, Bk, H, D = sizes
    n = 9
    caches, kc, vc = cache_views(kind, layout, sizes, cache_dtype, rng, device)
    values = None
    if kv_cache_dtype == "fp8_e4m3":
        values = [as_dtype(interesting_floats((n + 3, H, D), rng), x_dtype) for _ in range(2)]
    tokens, key, value = token_views(n, H, D, x_dtype, values, rng, device, contiguous=kind in ALIGNED_KINDS)
    slots = rng.permutation(num_blocks * Bk)[:n].astype(np.int64)
    slots[[2, 6]] = [-1, -5]  # any negative slot writes nothing
    scale_args = dict(k_scale=scales[0], v_scale=scales[1])
    ref_key, ref_value = tokens[0].mirror(key), tokens[1].mirror(value)
    reference.write(ref_key, ref_value, caches[0].mirror(kc), caches[-1].mirror(vc), slots, layout=layout,
                    kv_cache_dtype=kv_cache_dtype, **scale_args)
    with small_tiles(impl, tiles):
        WRITES[impl](key, value, kc, vc, torch.from_numpy(slots).to(device), layout=layout,
                     kv_cache_dtype=kv_cache_dtype, **scale_args)
    assert all(b.matches() for b in caches), "a cache differs from the reference"
    assert all(b.matches() for b in tokens), "the inputs changed"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("impl", list(WRITES))
def test_write_matches_the_reference(backend, impl, layout, dtype_name, kind):
    run_write(impl, layout, dtype_name, kind, backend.device)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_write_in_several_tiles(backend, layout, dtype_name):
    run_write("triton", layout, dtype_name, "padded-transposed", backend.device, seed=1, tiles="small")


@pytest.mark.parametrize("key_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("impl", list(WRITES))
def test_fp8_write_from_every_input_dtype(backend, impl, key_dtype):
    run_write(impl, "NHD", "fp8", "contiguous", backend.device, seed=2, key_dtype=key_dtype)


@pytest.mark.parametrize("scales", [(2.0**-70, 2.0**70), (2.0**64, 2.0**-65)])
def test_fp8_write_with_a_scale_past_the_fast_division(backend, scales):
    """Scales outside [2**-64, 2**64] take IEEE division: with 2**-70 most values
    saturate, with 2**70 most become zeros (subnormal quotients included)."""
    run_write("triton", "NHD", "fp8", "contiguous", backend.device, seed=9, key_dtype=torch.float32, scales=scales)


@pytest.mark.parametrize("impl", list(WRITES))
def test_fp8_write_divides_in_float32(backend, impl):
    # Hand-worked in tests/reference/test_kv.py: 3 * 2**-11 / 0.1 -> 0x08 (not float64's
    # 0x07); 9 * 2**-11 / 0.3 -> 0x07 (not 0x08, a multiply by the reciprocal's).
    d = backend.device
    key = torch.tensor([3 * 2.0**-11, 9 * 2.0**-11], dtype=torch.float32, device=d).reshape(2, 1, 1)
    kc = torch.zeros((2, 1, 1, 1), dtype=torch.uint8, device=d)
    vc = torch.zeros_like(kc)
    WRITES[impl](key, key, kc, vc, torch.tensor([0, 1], device=d), layout="NHD", kv_cache_dtype="fp8_e4m3",
                 k_scale=0.1, v_scale=0.3)
    assert kc.ravel().tolist()[0] == 0x08 and vc.ravel().tolist()[1] == 0x07


def test_an_unchecked_write_skips_slots_outside_the_cache(backend):
    """With the data checks off (a caller that checks elsewhere), a slot past the cache
    is skipped on the device, never written past the buffer's end."""
    rng = np.random.default_rng(3)
    d = backend.device
    caches, kc, vc = cache_views("one-tensor", "NHD", (2, 2, 1, 4), torch.float32, rng, d)
    key = torch.from_numpy(rng.standard_normal((3, 1, 4)).astype(np.float32)).to(d)
    slots = np.array([1, 4, 2**40], np.int64)  # 4 = num_blocks * Bk: just past the end
    with data_checks(False):
        kv.write(key, key, kc, vc, torch.from_numpy(slots).to(d), layout="NHD", kv_cache_dtype="auto")
    reference.write(key.cpu().numpy()[:1], key.cpu().numpy()[:1], caches[0].mirror(kc), caches[0].mirror(vc),
                    slots[:1], layout="NHD", kv_cache_dtype="auto")
    assert caches[0].matches()


def test_an_empty_write_changes_nothing(backend):
    rng = np.random.default_rng(4)
    caches, kc, vc = cache_views("contiguous", "HND", (2, 2, 1, 4), torch.float16, rng, backend.device)
    empty = torch.zeros((0, 1, 4), dtype=torch.float16, device=backend.device)
    for fn in WRITES.values():
        fn(empty, empty, kc, vc, torch.zeros(0, dtype=torch.int64, device=backend.device), layout="HND",
           kv_cache_dtype="auto")
    assert all(b.matches() for b in caches)


# ---- copy ---------------------------------------------------------------------------

def run_copy(impl: str, dtype_name: str, kind: str, device, seed: int = 0, rows: tuple | None = None) -> None:
    rng = np.random.default_rng(seed)
    cache_dtype = DTYPES[dtype_name][1]
    sizes = {"padded-transposed": (8, 3, 2, 5), "aligned": (8, 4, 2, 16),
             "one-pointer-shifted": (8, 4, 2, 16)}.get(kind, (8, 4, 2, 8))
    layers = [cache_views(kind, "NHD", sizes, cache_dtype, rng, device) for _ in range(2)]
    # Sources may repeat; destinations are distinct and never a source.
    blocks = rng.permutation(sizes[0])
    pairs = np.stack([rng.choice(blocks[:3], 4), blocks[3:7]], axis=1).astype(np.int64)
    reference.copy_blocks([bufs[0].mirror(kc) for bufs, kc, _ in layers],
                          [bufs[-1].mirror(vc) for bufs, _, vc in layers], pairs)
    patch = mock.patch.object(kv, "launch_rows", lambda *a: rows) if rows else mock.patch.object(
        kv, "launch_rows", kv.launch_rows)
    with patch:
        COPIES[impl]([kc for _, kc, _ in layers], [vc for _, _, vc in layers], torch.from_numpy(pairs).to(device))
    assert all(b.matches() for bufs, _, _ in layers for b in bufs)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("impl", list(COPIES))
def test_copy_matches_the_reference(backend, impl, dtype_name, kind):
    run_copy(impl, dtype_name, kind, backend.device)


@pytest.mark.parametrize("kind", KINDS)
def test_copy_in_several_row_tiles(backend, kind):
    # 4 rows a program: a block of 3 * 2 or 4 * 2 rows takes two programs, the last partial.
    run_copy("triton", "bfloat16", kind, backend.device, seed=1, rows=(4, 1))


def test_an_unchecked_copy_skips_blocks_outside_the_caches(backend):
    rng = np.random.default_rng(5)
    d = backend.device
    bufs, kc, vc = cache_views("one-tensor", "NHD", (4, 2, 1, 4), torch.float16, rng, d)
    pairs = np.array([[0, 1], [2, 4], [-1, 3]], np.int64)  # only (0, 1) lies inside
    with data_checks(False):
        kv.copy_blocks([kc], [vc], torch.from_numpy(pairs).to(d))
    reference.copy_blocks([bufs[0].mirror(kc)], [bufs[0].mirror(vc)], pairs[:1])
    assert bufs[0].matches()


# ---- gather -------------------------------------------------------------------------

def run_gather(impl: str, layout: str, dtype_name: str, kind: str, device, seed: int = 0,
               tiles: str = "default") -> None:
    rng = np.random.default_rng(seed)
    _, cache_dtype, kv_cache_dtype = DTYPES[dtype_name]
    out_dtype = torch.float32 if kv_cache_dtype == "fp8_e4m3" else cache_dtype
    sizes = {"padded-transposed": (6, 3, 3, 5), "aligned": (6, 4, 2, 16),
             "one-pointer-shifted": (6, 4, 2, 16)}.get(kind, (6, 4, 2, 8))
    num_blocks, Bk, H, D = sizes
    caches, kc, vc = cache_views(kind, layout, sizes, cache_dtype, rng, device)  # random bits: every code
    lengths = [5, 0, 1, 3 * Bk]  # an empty request, and one that fills its row
    width = 3
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table_buf = np.full((len(lengths) + 1, 2 * width), 2**31 - 1, np.int32)  # unread columns: far outside
    for r, length in enumerate(lengths):
        used = -(-length // Bk)
        table_buf[r, :2 * used:2] = rng.integers(0, num_blocks, used)
    total = int(cu[-1])
    out_rows = total + 3  # three rows past cu_lens[N]: never written
    if kind in ALIGNED_KINDS:
        outs = [Buffer.poisoned((out_rows, H, D), out_dtype, rng, device) for _ in range(2)]
        out_key, out_value = outs[0].tensor, outs[1].tensor
    else:
        outs = [Buffer.poisoned((out_rows, H, D + 1), out_dtype, rng, device),
                Buffer.poisoned((H, out_rows, D), out_dtype, rng, device)]
        out_key, out_value = outs[0].tensor[:, :, 1:], outs[1].tensor.permute(1, 0, 2)
    table = table_buf[:, ::2]  # a column-strided view
    scales = dict(k_scale=0.37, v_scale=3.0)
    reference.gather(caches[0].mirror(kc), caches[-1].mirror(vc), table, cu, outs[0].mirror(out_key),
                     outs[1].mirror(out_value), layout=layout, kv_cache_dtype=kv_cache_dtype, **scales)
    table_t = torch.from_numpy(table_buf).to(device)[:, ::2]
    with small_tiles(impl, tiles):
        GATHERS[impl](kc, vc, table_t, torch.from_numpy(cu).to(device), out_key, out_value, layout=layout,
                      kv_cache_dtype=kv_cache_dtype, **scales)
    assert all(b.matches() for b in outs), "an output differs from the reference"
    assert all(b.matches() for b in caches), "a cache changed"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("impl", list(GATHERS))
def test_gather_matches_the_reference(backend, impl, layout, dtype_name, kind):
    run_gather(impl, layout, dtype_name, kind, backend.device)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "fp8"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_gather_in_several_tiles(backend, layout, dtype_name):
    run_gather("triton", layout, dtype_name, "padded-transposed", backend.device, seed=1, tiles="small")


@pytest.mark.parametrize("kind", ALIGNED_KINDS)
@pytest.mark.parametrize("dtype_name", ["bfloat16", "fp8"])
@pytest.mark.parametrize("op", ["write", "copy", "gather"])
def test_the_aligned_and_unaligned_compilations_both_match_the_reference(backend, op, dtype_name, kind):
    """The aligned compilation takes tensors only where all of them are aligned (on a
    GPU a wrong claim is a misaligned vector access or wrong bytes); one pointer off by
    an element sends the call to the unaligned one."""
    taken, real = [], kv.aligned_strides

    def spy(tensors, strides):
        align, passed = real(tensors, strides)
        taken.append(align)
        return align, passed

    with mock.patch.object(kv, "aligned_strides", spy):
        if op == "write":
            run_write("triton", "NHD", dtype_name, kind, backend.device)
        elif op == "copy":
            run_copy("triton", dtype_name, kind, backend.device)
        else:
            run_gather("triton", "NHD", dtype_name, kind, backend.device)
    assert taken and set(taken) == {16 if kind == "aligned" else 1}


def test_an_unchecked_gather_leaves_rows_with_bad_blocks_alone(backend):
    rng = np.random.default_rng(6)
    d = backend.device
    bufs, kc, vc = cache_views("contiguous", "NHD", (2, 2, 1, 4), torch.float32, rng, d)
    out = Buffer.poisoned((4, 1, 4), torch.float32, rng, d)
    table = np.array([[1, 7]], np.int32)  # block 7 does not exist: tokens 2 and 3 read nothing
    expected = out.array.copy()
    cache = bufs[0].array
    expected[0], expected[1] = cache[1, 0], cache[1, 1]
    with data_checks(False):
        kv.gather(kc, kc, torch.from_numpy(table).to(d), torch.tensor([0, 4], dtype=torch.int32, device=d),
                  out.tensor, out.tensor, layout="NHD", kv_cache_dtype="auto")
    assert np.array_equal(out.tensor.cpu().numpy().view(np.uint32), expected.view(np.uint32))


# ---- the in-kernel fp8 codec, on its own ----------------------------------------------

@triton.jit
def _encode(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, e4m3_encode(tl.load(x_ptr + offs, mask=offs < n)).to(tl.uint8), mask=offs < n)


@triton.jit
def _decode(code_ptr, out_ptr, scale, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, e4m3_decode(tl.load(code_ptr + offs).to(tl.int32), scale))


def encoder_inputs(rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """float32 inputs where an fp8 encoder can go wrong, for quotients by `scale`:
    every float16 and bfloat16 value, the midpoints between neighbouring codes times
    the scale and the floats next to them, the float32 extremes (both signs), and
    random bit patterns."""
    every16 = np.arange(2**16, dtype=np.uint16)
    mid = ((MAGNITUDES[:-1] + MAGNITUDES[1:]) / 2 * np.float32(scale)).astype(np.float32)
    near = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(0))])
    extremes = np.array([0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FFFFFFF,
                         0x7FC00000, 0x3C7FFFFF, 0x3C800000, 0x43E00000, 0x43E7FFFF, 0x43E80000, 0x43F00000],
                        np.uint32)
    return np.concatenate([every16.view(np.float16).astype(np.float32), bfloat16_to_float32(every16), near, -near,
                           extremes.view(np.float32), -extremes.view(np.float32),
                           rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)])


def test_kernel_encoder_matches_the_reference_everywhere_it_matters(backend):
    """e4m3_encode on `encoder_inputs`."""
    x = encoder_inputs(np.random.default_rng(7))
    out = torch.zeros(len(x), dtype=torch.uint8, device=backend.device)
    block = 65536
    with np.errstate(invalid="ignore"):  # the interpreter's numpy on signalling NaNs
        _encode[(-(-len(x) // block),)](torch.from_numpy(x).to(backend.device), out, len(x), BLOCK=block)
    got = out.cpu().numpy()
    expected = encode_e4m3(x)
    assert np.array_equal(got, expected), f"first difference at {x[got != expected][:5]}"


@pytest.mark.parametrize("scale", [1.0, 0.37, 2.0**-20])
def test_kernel_decoder_matches_the_reference_on_all_256_codes(backend, scale):
    codes = np.arange(256, dtype=np.uint8)
    out = torch.zeros(256, dtype=torch.float32, device=backend.device)
    _decode[(1,)](torch.from_numpy(codes).to(backend.device), out, scale, BLOCK=256)
    expected = reference.dequantize(codes, scale)
    assert np.array_equal(out.cpu().numpy().view(np.uint32), expected.view(np.uint32))
    assert np.array_equal(decode_e4m3(codes)[:0x7F] * np.float32(scale), expected[:0x7F])  # the reading


def encoders(backend) -> list[bool]:
    """The fp8 encoders this backend has, as `quantize`'s HARDWARE_FP8: the integer
    one always, the GPU's conversion where the write uses it."""
    return [False, True] if kv.hardware_fp8(backend) else [False]


@triton.jit
def _quantize_both_ways(bits_ptr, count, scale, reciprocal, fast_ptr, exact_ptr, HARDWARE_FP8: tl.constexpr,
                        BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(bits_ptr + offs, mask=offs < count).to(tl.float32, bitcast=True)
    tl.store(fast_ptr + offs, quantize(x, scale, reciprocal, False, HARDWARE_FP8), mask=offs < count)
    tl.store(exact_ptr + offs, quantize(x, scale, reciprocal, True, HARDWARE_FP8), mask=offs < count)


def _quantize(bits: np.ndarray, scale: float, hardware: bool, device) -> tuple[np.ndarray, np.ndarray]:
    """(fast, exact) codes of the float32 bit patterns by one encoder."""
    fast = torch.zeros(len(bits), dtype=torch.uint8, device=device)
    exact = torch.zeros_like(fast)
    with np.errstate(all="ignore"):  # the interpreter's numpy on overflow and signalling NaNs
        _quantize_both_ways[(-(-len(bits) // 8192),)](torch.from_numpy(bits).to(device), len(bits), scale,
                                                     kv.reciprocal(scale), fast, exact, HARDWARE_FP8=hardware,
                                                     BLOCK=8192)
    return fast.cpu().numpy(), exact.cpu().numpy()


@pytest.mark.parametrize("scale", [1.0, 2.0**-100, 2.0**100])
def test_the_encoders_agree_with_the_reference_everywhere_it_matters(backend, scale):
    """`quantize` by each encoder on `encoder_inputs` for this scale, each input also
    with the other sign. Scales 2**±100 take IEEE division, and with them subnormal
    quotients and quotients past the float32 range."""
    bits = encoder_inputs(np.random.default_rng(10), scale).view(np.uint32)
    bits = np.concatenate([bits, bits ^ np.uint32(2**31)]).view(np.int32)  # each with the other sign too
    expected = reference.quantize(bits.view(np.float32), scale)
    for hardware in encoders(backend):
        fast, exact = _quantize(bits, scale, hardware, backend.device)
        assert np.array_equal(exact, expected), f"hardware={hardware}: first difference at {bits[exact != expected][:5]}"
        if kv.FAST_DIVISION_SCALES[0] <= scale <= kv.FAST_DIVISION_SCALES[1]:
            assert np.array_equal(fast, expected), f"hardware={hardware}: first at {bits[fast != expected][:5]}"


@triton.jit
def _count_disagreements(first_bits, count, scale, reciprocal, out_ptr, EXACT_DIVISION: tl.constexpr,
                         HARDWARE_FP8: tl.constexpr, BLOCK: tl.constexpr):
    """How many of the floats first_bits + i (i < count) one encoder and division code
    otherwise than the integer encoder after IEEE division (the encoder test's)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = (first_bits + offs).to(tl.float32, bitcast=True)
    differ = quantize(x, scale, reciprocal, EXACT_DIVISION, HARDWARE_FP8) != quantize(x, scale, reciprocal, True,
                                                                                      False)
    tl.atomic_add(out_ptr, tl.sum((differ & (offs < count)).to(tl.int32)))


DIVISION_SCALES = [0.37, 0.1, 1.0, 3.0, 1e-3, 123.456, 2.0**-60, 2.0**60, 0.99999994, 1.0000001, 1.9999999,
                   0.7211971, 1.3333334, 448.0 / 1000.0]


def _window_bits(scale: float) -> tuple[int, int]:
    """[first, last) float32 bit patterns whose quotient by scale lies in [2**-12, 2**10]:
    everything from below the first code to past saturation."""
    lo = np.array([scale * 2.0**-12], np.float32).view(np.int32)[0]
    hi = np.array([scale * 2.0**10], np.float32).view(np.int32)[0]
    return int(lo), int(hi)


@pytest.mark.parametrize("scale", DIVISION_SCALES)
def test_fast_division_gives_the_codes_of_ieee_division(backend, scale):
    """The write's three-operation division (kernels/fp8.py `divide`) against IEEE
    division and the reference, by each encoder: on random floats across the window
    where codes change, the floats beside every midpoint between two codes, and the
    specials. (On a GPU the next test covers every float32.)"""
    rng = np.random.default_rng(8)
    lo, hi = _window_bits(scale)
    mid = ((MAGNITUDES[:-1] + MAGNITUDES[1:]) / 2 * scale).astype(np.float32).view(np.int32)
    near = (mid[:, None] + np.arange(-8, 9)[None, :]).ravel()
    specials = np.array([0, 0x00000001, 0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x7F800001], np.int32)
    bits = np.concatenate([rng.integers(lo, hi, 2**16), near, specials]).astype(np.int32)
    bits = np.concatenate([bits, bits | np.int32(-2**31)])  # both signs
    expected = reference.quantize(bits.view(np.float32), scale)
    for hardware in encoders(backend):
        fast, exact = _quantize(bits, scale, hardware, backend.device)
        assert np.array_equal(exact, expected), f"hardware={hardware}"
        assert np.array_equal(fast, expected), f"hardware={hardware}"


@pytest.mark.gpu
@pytest.mark.parametrize("scale", DIVISION_SCALES)
def test_every_encoder_and_division_on_every_float32(backend, scale):
    """All 2**32 bit patterns (each sign in one launch of 2**31), each encoder with each
    division against the integer encoder after IEEE division."""
    for exact, hardware in [(False, False)] + [(e, True) for e in (False, True) if True in encoders(backend)]:
        out = torch.zeros(1, dtype=torch.int32, device=backend.device)
        for first in (0, -2**31):
            _count_disagreements[(2**31 // 4096,)](first, 2**31, scale, kv.reciprocal(scale), out,
                                                   EXACT_DIVISION=exact, HARDWARE_FP8=hardware, BLOCK=4096)
        assert out.item() == 0, f"exact={exact}, hardware={hardware}: {out.item()} floats coded otherwise"


# ---- GPU only: addresses past 2**31 elements --------------------------------------------

@pytest.mark.gpu
def test_block_ids_times_strides_past_int32(backend):
    """A uint8 cache of more than 2**31 elements: the last block's offset * stride needs
    int64. Write one token there, copy the block, read it back."""
    d = backend.device
    Bk, H, D = 16, 1, 128
    num_blocks = 2**31 // (Bk * H * D) + 4
    buf = torch.zeros((num_blocks, 2, Bk, H, D), dtype=torch.uint8, device=d)
    kc, vc = buf[:, 0], buf[:, 1]
    last = num_blocks - 1
    key = torch.full((1, H, D), 3.0, dtype=torch.bfloat16, device=d)
    kv.write(key, -key, kc, vc, torch.tensor([last * Bk + 5], device=d), layout="NHD", kv_cache_dtype="fp8_e4m3")
    assert kc[last, 5].eq(0x44).all() and vc[last, 5].eq(0xC4).all()  # ±3.0: e=8, m=4
    assert int(buf.count_nonzero()) == 2 * H * D  # nowhere else
    kv.copy_blocks([kc], [vc], torch.tensor([[last, 0]], device=d))
    assert torch.equal(buf[0], buf[last])
    out = torch.zeros((Bk, H, D), dtype=torch.float32, device=d)
    kv.gather(kc, vc, torch.tensor([[last]], dtype=torch.int32, device=d),
              torch.tensor([0, Bk], dtype=torch.int32, device=d), out, out.clone(), layout="NHD",
              kv_cache_dtype="fp8_e4m3")
    assert out[5].eq(3.0).all() and int(out.count_nonzero()) == H * D


@pytest.mark.gpu
def test_slots_past_int32(backend):
    """More than 2**31 slots (H = D = 1 keeps the cache at 2 GiB): slot ids take the
    kernel's 64-bit path, and a slot past 2**31 lands where it should."""
    d = backend.device
    Bk = 16
    num_blocks = 2**31 // Bk + 2
    buf = torch.zeros((num_blocks, 2, Bk, 1, 1), dtype=torch.uint8, device=d)
    kc, vc = buf[:, 0], buf[:, 1]
    key = torch.tensor([[[1.0]], [[2.0]]], dtype=torch.float16, device=d)
    slots = [2**31 + 17, 5]
    kv.write(key, key, kc, vc, torch.tensor(slots, device=d), layout="NHD", kv_cache_dtype="fp8_e4m3")
    assert kc[(2**31 + 17) // Bk, 17 % Bk].item() == 0x38 and kc[0, 5].item() == 0x40  # 1.0, 2.0
    assert int(buf.count_nonzero()) == 4
