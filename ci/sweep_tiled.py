"""Variants of the tiled slot-mapping kernel side by side (GPU), each checked
against the vectorized reference before it is timed. Prints medians in µs of
CUDA-graph replays, one line per shape: variant/tokens-per-program/warps=µs."""

import torch
import triton
import triton.language as tl
import triton.testing

from blocktable import device

device.select("cuda")
from blocktable.cli.bench import make_inputs  # noqa: E402
from blocktable.kernels.slot_mapping import slot_mapping_tiled as window, token_slots  # noqa: E402


@triton.jit
def token_slots64(p, row_ptr, width, K, B, W, R, I):
    P = K // B
    vb = K * W
    vbi = p // vb
    vbo = p - vbi * vb
    local = ((vbo // I) % W) == R
    lofs = (vbo // (W * I)) * I + vbo % I
    col = vbi * P + lofs // B
    keep = local & (col < width)
    block = tl.load(row_ptr + col, mask=keep, other=0).to(tl.int64)
    return block * B + lofs % B, keep


@triton.jit
def flat(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr, num_reqs, num_tokens, max_num_tokens, width,
         K, B, W, R, I, SEARCH_STEPS: tl.constexpr, BLOCK: tl.constexpr, INT32: tl.constexpr):
    t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    is_token = t < num_tokens
    req = tl.zeros([BLOCK], dtype=tl.int32)
    size = num_reqs
    for _ in tl.static_range(SEARCH_STEPS):
        half = size // 2
        start = tl.load(qsl_ptr + req + half, mask=is_token, other=0)
        req = tl.where(start <= t, req + half, req)
        size -= half
    p = tl.load(pos_ptr + t, mask=is_token, other=0)
    row = table_ptr + req.to(tl.int64) * table_stride
    if INT32:
        slot, keep = token_slots(p, row, width, K, B, W, R, I)
    else:
        slot, keep = token_slots64(p, row, width, K, B, W, R, I)
    tl.store(out_ptr + t, tl.where(keep & is_token, slot, -1), mask=t < max_num_tokens)


SHAPES = [("decode-256", 256, 1), ("decode-1024", 1024, 1), ("mixed-64x128", 64, 128), ("prefill-1x16384", 1, 16384),
          ("prefill-8x2048", 8, 2048), ("256x4096", 256, 4096), ("64x65536", 64, 65536)]
VARIANTS = [("window", window, {}), ("flat32", flat, {"INT32": True}), ("flat64", flat, {"INT32": False})]
CONFIGS = [(256, 4), (256, 8), (512, 4), (512, 8), (1024, 4), (1024, 8)]
for W, I in [(1, 1), (4, 16)]:
    for name, n, per in SHAPES:
        x = make_inputs(n, per, W, I, 0, "cuda")
        c = x["config"]
        out = torch.empty(x["T"], dtype=torch.int64, device="cuda")
        N, T = x["qsl"].numel() - 1, x["T"]
        cells = []
        for vname, kernel, extra in VARIANTS:
            for block, warps in CONFIGS:
                def call():
                    kernel[(triton.cdiv(T, block),)](
                        x["qsl"], x["positions"], x["table"], x["table"].stride(0), out, N, T, T,
                        x["table"].shape[1], c["kv_block_size"], c["kernel_block_size"], c["cp_world_size"],
                        c["cp_rank"], c["cp_interleave"], SEARCH_STEPS=max(0, N - 1).bit_length(), BLOCK=block,
                        num_warps=warps, **extra)
                out.fill_(-7)
                call()
                assert (out.cpu().numpy() == x["expected"]).all(), (name, vname, block, warps)
                us = triton.testing.do_bench_cudagraph(call, rep=40, return_mode="median") * 1e3
                cells.append((us, f"{vname}/{block}/{warps}"))
        best = sorted(cells)[:3]
        print(f"W={W} {name:>16} T={T:>8}: best " + "  ".join(f"{lab}={us:.2f}" for us, lab in best)
              + " | " + " ".join(f"{lab}={us:.2f}" for us, lab in cells), flush=True)
