"""Tile sweep for the package's tiled slot-mapping kernels (GPU): tokens per program
x warps x search mode (per token, or whole tiles first), on the bench shapes, for `triton-tiled` (run-time sizes) and
`triton-specialized` (K, B, W, I compiled in). Each configuration goes through the
package's own launcher (its tile choice overridden), is checked against the
vectorized reference before it is timed; medians of CUDA-graph replays, µs.

    python ci/sweep_tiled.py [SHAPE ...]   # on a GPU machine with the package installed
"""

import functools
import sys
from unittest import mock

import torch
import triton.testing

from blocktable import device, plugin, slot

device.select("cuda")
from blocktable.checks import data_checks  # noqa: E402
from blocktable.cli.bench import SHAPES, make_inputs  # noqa: E402

CONFIGS = [(64, 2), (128, 4), (256, 4), (256, 8), (512, 4), (1024, 4), (2048, 4)]
KERNELS = ["triton-tiled", "triton-specialized"]


def launch(kernel, x, out, forced):
    with mock.patch.object(slot, "tiled_launch", lambda *a, **k: forced), data_checks(False):
        kernel(x["qsl"], x["positions"], x["table"], out, **x["config"])


for W, I in [(1, 1), (4, 16)]:
    for name, requests, per_request in SHAPES:
        if sys.argv[1:] and name not in sys.argv[1:]:
            continue
        x = make_inputs(requests, per_request, W, I, 0, "cuda")
        out = torch.empty(x["T"], dtype=torch.int64, device="cuda")
        for label in KERNELS:
            kernel = plugin.load(label)
            cells = []
            for (block, warps), whole in [(cfg, w) for w in (False, True) for cfg in CONFIGS]:
                if whole and per_request < block:
                    continue  # the whole-tile search only pays where requests span tiles
                call = functools.partial(launch, kernel, x, out, (block, warps, whole))
                out.fill_(-7)
                call()
                assert (out.cpu().numpy() == x["expected"]).all(), (name, label, block, warps, whole)
                us = triton.testing.do_bench_cudagraph(call, rep=40, return_mode="median") * 1e3
                cells.append(f"{block}/{warps}{'w' if whole else ''}={us:.2f}")
            print(f"W={W} {name:>16} {label:>18}: " + " ".join(cells), flush=True)
