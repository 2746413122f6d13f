"""properties/kv/data.py: the device fill the lockstep hands a gather as its outputs
holds the bytes an upload of the host's fill would."""

from __future__ import annotations

import numpy as np
import pytest

from blocktable.device import to_host
from blocktable.properties.kv.data import HOST, TORCH, fetchable, filled, to_device


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "uint8"])
def test_a_device_fill_holds_the_bytes_of_the_uploaded_host_fill(backend, dtype):
    shape = (5, 3, 4)
    host = np.full(int(np.prod(shape)) * np.dtype(HOST[dtype]).itemsize, 0x5A, dtype=np.uint8)
    host = host.view(HOST[dtype]).reshape(shape)
    made = filled(shape, dtype, 0x5A, backend)
    sent = to_device(host, dtype, backend)
    assert (made.shape, made.dtype, made.device.type) == (sent.shape, sent.dtype, sent.device.type) == \
        (shape, TORCH[dtype], backend.device.type)
    assert made.is_contiguous() and made.storage_offset() == 0
    back, reference = to_host([fetchable(made), fetchable(sent)])
    assert np.array_equal(back.view(np.uint8), host.view(np.uint8).reshape(back.view(np.uint8).shape))
    assert np.array_equal(back, reference)


def test_each_fill_is_its_own_memory(backend):
    """The lockstep hands the gather two outputs: a write into one must not show in the other."""
    a, b = (filled((2, 1, 2), "float32", 0x5A, backend) for _ in range(2))
    a.fill_(0)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert np.array_equal(to_host([b])[0].view(np.uint8).reshape(-1), np.full(16, 0x5A, dtype=np.uint8))
