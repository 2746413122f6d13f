"""BLOCKTABLE_BLOCKING_SYNC=1 (blocktable/device.py): a process that runs kernels on a
GPU waits for it asleep. On a GPU the primary context torch then uses carries the
driver's blocking-sync flag; without a driver nothing changes and nothing fails."""

import os
import subprocess
import sys

import pytest
import torch

from blocktable import device

# The scheduling bits of the context torch made, read back from the driver.
READ_FLAGS = """
import ctypes
from blocktable import device
backend = device.select("cuda")
import torch
torch.zeros(1, device=backend.device)
driver = ctypes.CDLL("libcuda.so.1")
flags = ctypes.c_uint()
assert driver.cuCtxGetFlags(ctypes.byref(flags)) == 0
print(flags.value & 0x07)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("setting, flag", [("1", device.CU_CTX_SCHED_BLOCKING_SYNC), ("0", 0)])
def test_the_context_torch_uses_blocks_only_when_asked(setting, flag):
    env = dict(os.environ, **{device.BLOCKING_SYNC_VARIABLE: setting})
    out = subprocess.run([sys.executable, "-c", READ_FLAGS], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) == flag


def test_it_says_whether_the_driver_took_it_and_selects_as_before():
    code = ("from blocktable import device\n"
            "print(device.block_while_waiting(), device.select('cpu').name)\n")
    env = dict(os.environ, **{device.BLOCKING_SYNC_VARIABLE: "1"})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    took, name = out.stdout.split()
    assert name == "interpreter"
    assert took == str(torch.cuda.is_available())  # a GPU host has the driver; the CPU machines have none
