"""GPU-only checks of the compiled kernels: captured in a CUDA graph and replayed
with new inputs (as a serving engine runs them), and at production sizes against
the vectorized reading of the reference."""

import numpy as np
import pytest
import torch

from blocktable import plugin
from blocktable.checks import data_checks
from blocktable.properties.slot.truth import slot_mapping_vectorized

pytestmark = pytest.mark.gpu
KERNELS = ["triton-tiled", "triton-specialized", "triton-per-request"]


def inputs(rng, requests, per_request, width, K, B, W):
    lengths = rng.integers(0, 2 * per_request + 1, size=requests)
    qsl = np.zeros(requests + 1, np.int32)
    qsl[1:] = np.cumsum(lengths)
    T = int(qsl[-1])
    positions = rng.integers(0, (width // (K // B) + 1) * K * W, size=T).astype(np.int64)
    table = rng.integers(0, 2**31 - 1, size=(requests + 2, width), dtype=np.int64).astype(np.int32)
    return qsl, positions, table


@pytest.mark.parametrize("kernel", KERNELS)
def test_cuda_graph_replay_with_new_inputs(kernel):
    rng = np.random.default_rng(0)
    fn = plugin.load(kernel)
    config = dict(kv_block_size=32, kernel_block_size=16, cp_world_size=2, cp_rank=1, cp_interleave=8)
    qsl, positions, table = inputs(rng, 16, 40, 64, 32, 16, 2)
    static = [torch.from_numpy(a).cuda() for a in (qsl, positions, table)]
    out = torch.full((len(positions) + 5,), -7, dtype=torch.int64, device="cuda")
    with data_checks(False):  # the data checks read device memory back: not capturable
        fn(*static, out, **config)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(*static, out, **config)
    for seed in range(1, 4):  # the same layout (a captured graph's shapes), new positions and ids
        fresh = np.random.default_rng(seed)
        q2 = qsl
        p2 = fresh.integers(0, 4000, size=len(positions)).astype(np.int64)
        t2 = fresh.integers(0, 2**31 - 1, size=table.shape, dtype=np.int64).astype(np.int32)
        static[1].copy_(torch.from_numpy(p2))
        static[2].copy_(torch.from_numpy(t2))
        out.fill_(-7)
        graph.replay()
        expected = slot_mapping_vectorized(q2, p2, t2, out.numel(), **config)
        assert np.array_equal(out.cpu().numpy(), expected)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("K, B, W, I", [(16, 16, 1, 1), (128, 64, 2, 128), (64, 16, 4, 16), (48, 16, 8, 3)])
def test_a_million_tokens_against_the_vectorized_reference(kernel, K, B, W, I):
    rng = np.random.default_rng(K * W)
    qsl, positions, table = inputs(rng, 256, 2048, 512, K, B, W)
    for rank in range(W):
        config = dict(kv_block_size=K, kernel_block_size=B, cp_world_size=W, cp_rank=rank, cp_interleave=I)
        out = torch.full((len(positions) + 100,), -7, dtype=torch.int64, device="cuda")
        plugin.load(kernel)(*(torch.from_numpy(a).cuda() for a in (qsl, positions, table)), out, **config)
        expected = slot_mapping_vectorized(qsl, positions, table, out.numel(), **config)
        assert np.array_equal(out.cpu().numpy(), expected)


def test_commit_snapshot_survives_a_host_edit_in_flight():
    """Many commits of a large table, each followed at once by a host edit: the
    device must always hold the snapshot (the pinned staging buffer's job)."""
    from blocktable.table import BlockTable

    table = BlockTable(256, 65536, kv_block_size=16, kernel_block_size=16)
    for round in range(20):
        table.host[:] = round
        expected = table.host.copy()
        table.commit(256)
        table.host[:] = -round - 1
        assert np.array_equal(table.device_rows(), expected), round
