"""The backend choice: made once per process, before any kernel module loads."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from blocktable import device


def test_the_choice_is_stable_and_described(backend):
    assert device.select("auto") is backend
    assert device.current() is backend
    text = backend.describe()
    assert ("interpreter" in text) == backend.interpreted and "triton" in text


def test_unknown_choice_is_rejected():
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, got 'tpu'"):
        device.select("tpu")


def test_switching_after_the_choice_is_refused(backend):
    other = "cpu" if backend.name == "cuda" else "cuda"
    expected = RuntimeError
    with pytest.raises(expected, match="already runs kernels on|torch sees no CUDA GPU"):
        device.select(other)


def test_interpreter_env_is_set_before_kernels_load(tmp_path):
    """A fresh process choosing the CPU sets TRITON_INTERPRET, and its kernels are interpreted."""
    code = ("from blocktable import device; b = device.select('cpu'); import os; "
            "import blocktable.kernels.slot_mapping as k; "
            "print(b.name, os.environ['TRITON_INTERPRET'], type(k.slot_mapping_per_request).__name__)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # From a scratch folder: at the repository root the bare `blocktable/` folder would
    # shadow a non-editable install.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         cwd=tmp_path)
    assert out.stdout.split() == ["interpreter", "1", "InterpretedFunction"]


def test_kernels_imported_in_the_wrong_mode_are_detected(tmp_path):
    code = ("import blocktable.kernels.slot_mapping; from blocktable import device; device.select('cpu')")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode != 0 and "call blocktable.device.select() first" in out.stderr


@pytest.mark.parametrize("tensor, dtype, ndim, error, match", [
    ([1, 2], torch.int32, 1, TypeError, "x must be a torch.Tensor, got list"),
    (torch.zeros(2, dtype=torch.int64), torch.int32, 1, TypeError, "x must be torch.int32, got torch.int64"),
    (torch.zeros((2, 2), dtype=torch.int32), torch.int32, 1, ValueError, "x must be 1-D, got shape \\(2, 2\\)"),
])
def test_check_tensor(backend, tensor, dtype, ndim, error, match):
    if isinstance(tensor, torch.Tensor):
        tensor = tensor.to(backend.device)
    with pytest.raises(error, match=match):
        device.check_tensor("x", tensor, dtype, ndim, backend)


def test_to_host_brings_mixed_tensors_back_whole(backend):
    """One copy for tensors of several dtypes and shapes (a step's tables and reads);
    each comes back with its own dtype and shape, as the host's own array."""
    d = backend.device
    table = torch.arange(-3, 12, dtype=torch.int32, device=d).reshape(3, 5)  # 60 bytes: the next one is unaligned
    reads = (torch.arange(8, dtype=torch.int64, device=d) - 2**40).reshape(2, 4)
    empty = torch.empty(0, dtype=torch.int64, device=d)
    raw = torch.tensor([7, 255], dtype=torch.uint8, device=d)
    got = device.to_host([table, reads, empty, raw])
    for array, tensor in zip(got, (table, reads, empty, raw)):
        assert array.shape == tuple(tensor.shape) and array.dtype == tensor.cpu().numpy().dtype
        assert (array == tensor.cpu().numpy()).all()
    # Layouts a caller's tensors can have: made from an empty numpy array (stride 0),
    # one element with stride 0, a transposed view.
    odd = [torch.from_numpy(np.zeros(0, dtype=np.int32)).to(d),
           torch.tensor([7], dtype=torch.int64, device=d).as_strided((1,), (0,)),
           torch.arange(6, dtype=torch.int32, device=d).reshape(2, 3).t()]
    for array, tensor in zip(device.to_host(odd), odd):
        assert array.shape == tuple(tensor.shape) and (array == tensor.cpu().numpy()).all()
    (alone,) = device.to_host([table])  # one tensor comes back without the gathering copy
    assert alone.shape == (3, 5) and alone.dtype == np.int32 and (alone == got[0]).all()
    table.add_(1)  # on the CPU a tensor and an array can share memory: these must not
    assert got[0][0, 0] == -3 and alone[0, 0] == -3
    assert device.to_host([]) == []


def test_arrays_uploaded_together_each_arrive_whole_and_aligned(backend):
    """One upload for arrays of several dtypes and shapes (a KV step's keys, pairs and
    lengths): each arrives with its own dtype, shape and bits, starting on a 16-byte
    boundary (the alignment Triton specializes a kernel's pointers on), and owns none of
    the caller's memory."""
    arrays = [np.arange(-3, 12, dtype=np.int32).reshape(3, 5),  # 60 bytes: the next one would be unaligned
              (np.arange(8, dtype=np.int64) - 2**40).reshape(2, 4),
              np.array([np.nan, -0.0, 1.5], dtype=np.float16).reshape(1, 3, 1),
              np.zeros((0, 2), dtype=np.int64),
              np.array([True, False, True]),
              np.arange(7, dtype=np.uint8)[::2],  # not contiguous
              np.array(5, dtype=np.int16)]
    sent = device.upload_arrays(arrays, backend)
    assert len(sent) == len(arrays)
    for array, tensor in zip(arrays, sent):
        assert tensor.device.type == backend.device.type
        assert tensor.shape == array.shape and tensor.dtype == torch.from_numpy(np.ascontiguousarray(array)).dtype
        assert tensor.data_ptr() % device.ALIGN == 0
        assert tensor.cpu().numpy().tobytes() == np.ascontiguousarray(array).tobytes()
    arrays[0][...] = 0  # the caller may reuse its arrays at once; the uploads keep what was sent
    assert int(sent[0][0, 0]) == -3
    assert device.upload_arrays([], backend) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_array_uploads_in_a_row_each_arrive_whole():
    """upload_arrays writes straight into the staging ring's buffers: like upload, each
    waits for its buffer's last transfer, so none is overwritten in flight."""
    busy = torch.randn(4096, 4096, device="cuda")
    sizes = [(3, 5000, 1, 70000, 0, 12, 9000)[i % 7] + i for i in range(3 * device._Staging.SLOTS + 5)]
    sent = []
    for n in sizes:
        busy = busy @ busy
        host = [np.arange(n, dtype=np.int64) * 7 - n, np.full(n % 5, n, dtype=np.int32)]
        sent.append(device.upload_arrays(host, device.select("cuda")))
        for array in host:
            array[...] = 0
    for n, (longs, ints) in zip(sizes, sent):
        assert torch.equal(longs.cpu(), torch.arange(n, dtype=torch.int64) * 7 - n)
        assert torch.equal(ints.cpu(), torch.full((n % 5,), n, dtype=torch.int32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_uploads_in_a_row_each_arrive_whole():
    """Uploads go through a ring of pinned staging buffers: each waits until the
    device has read its buffer's previous upload, so none is overwritten in flight,
    whatever the sizes (a buffer grows), however long the device's queue is, and
    however many times the ring goes round."""
    busy = torch.randn(4096, 4096, device="cuda")
    sizes = [(3, 5000, 1, 70000, 0, 12, 9000)[i % 7] + i for i in range(3 * device._Staging.SLOTS + 5)]
    sent = []
    for n in sizes:
        busy = busy @ busy  # keeps the device busy while the host queues the copies
        host = torch.arange(n, dtype=torch.int64) * 7 - n
        sent.append(device.upload(host))
        host.zero_()  # the caller may reuse its tensor at once
    for n, on_device in zip(sizes, sent):
        assert torch.equal(on_device.cpu(), torch.arange(n, dtype=torch.int64) * 7 - n)
