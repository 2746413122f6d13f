"""Which errors count as a device fault that poisons the process (properties/fault.py)."""

import pytest

from blocktable.properties import fault


@pytest.mark.parametrize("message", [
    "CUDA error: an illegal memory access was encountered",
    "Triton Error [CUDA]: misaligned address",
    "CUDA error: device-side assert triggered",
    "CUDA error: unspecified launch failure",
])
def test_sticky_cuda_errors_are_device_faults(message):
    assert fault.is_device_fault(RuntimeError(message))


@pytest.mark.parametrize("error", [
    RuntimeError("The size of tensor a (3) must match the size of tensor b (4)"),
    ValueError("illegal memory access"),  # not an error the device raises
    KeyError("x"),
])
def test_other_errors_are_not(error):
    assert not fault.is_device_fault(error)


def test_a_fault_wrapped_in_a_discrepancy_is_still_one():
    from blocktable.properties.compare import Discrepancy

    try:
        try:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        except RuntimeError as e:
            raise Discrepancy("group 0 rank 0 slot mapping", f"the kernel raised {e}") from e
    except Discrepancy as wrapped:
        assert fault.is_device_fault(wrapped)


def test_outside_a_harness_child_a_fault_does_not_end_the_process():
    fault.check(RuntimeError("CUDA error: an illegal memory access was encountered"))  # returns
