"""The comparisons (properties/compare.py): any one differing element, in any
integer or boolean dtype and in any layout, fails with its index and both values;
a kernel that changes a tensor it was handed, rather than writing into it, is
named with the change: what changed, from what to what, on which argument, and
whether that argument is one the kernel writes."""

import numpy as np
import pytest
import torch

from blocktable.plugin import KV_CONTRACTS, SLOT_MAPPING
from blocktable.properties.compare import Discrepancy, Handed, assert_arrays_equal, same_values


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_])
def test_one_differing_element_anywhere_is_found(dtype):
    expected = (np.arange(24).reshape(4, 6) % 2).astype(dtype)
    for index in [(0, 0), (2, 3), (3, 5)]:
        actual = expected.copy()
        actual[index] = not actual[index] if dtype is np.bool_ else actual[index] + 1
        assert not same_values(expected, actual)
        with pytest.raises(Discrepancy) as caught:
            assert_arrays_equal("rows", expected, actual)
        assert caught.value.index == index
        assert caught.value.expected == expected[index].item()
        assert caught.value.actual == actual[index].item()
    assert_arrays_equal("rows", expected, expected.copy())


def test_layout_does_not_matter_only_values_do():
    a = np.arange(30, dtype=np.int64).reshape(5, 6)
    transposed_copy = np.ascontiguousarray(a.T).T  # same values, Fortran order
    assert same_values(a, transposed_copy)
    assert same_values(a[:, ::2], a[:, ::2].copy())
    changed = transposed_copy.copy(order="F")
    changed[4, 5] = -1
    assert not same_values(a, changed)


def test_shape_and_dtype_must_match_too():
    with pytest.raises(Discrepancy, match="shape"):
        assert_arrays_equal("rows", np.zeros((2, 3), np.int32), np.zeros((3, 2), np.int32))
    with pytest.raises(Discrepancy, match="dtype"):
        assert_arrays_equal("rows", np.zeros(3, np.int32), np.zeros(3, np.int64))


def test_floats_compare_by_value():
    assert same_values(np.array([0.0, 1.5]), np.array([-0.0, 1.5]))
    assert not same_values(np.array([0.0, 1.5]), np.array([0.0, 2.5]))


def slot_call():
    """A slot-mapping call's four tensors, the output a view into a larger buffer as the harness hands it."""
    buffer = torch.zeros(9, dtype=torch.int64)
    return (torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
            torch.zeros((1, 4), dtype=torch.int32), buffer[1:8])


# (what the kernel does to slot_mapping, the report's words)
CHANGES = {
    "resize_ smaller": (lambda out: out.resize_(2),
                        "the kernel changed the shape of its output slot_mapping from (7,) to (2,)"),
    "resize_ past its storage": (lambda out: out.resize_(100),
                                 "the kernel changed the shape of its output slot_mapping from (7,) to (100,)"),
    "set_ one element on": (lambda out: out.set_(out.untyped_storage(), 2, (7,), (1,)),
                            "the kernel changed the memory of its output slot_mapping: it no longer views the "
                            "buffer it was handed"),
    "set_ to another tensor": (lambda out: out.set_(torch.full((7,), -1, dtype=torch.int64)),
                               "the kernel changed the memory of its output slot_mapping: it no longer views the "
                               "buffer it was handed"),
    "set_ to a strided view": (lambda out: out.set_(out.untyped_storage(), 1, (7,), (0,)),
                               "the kernel changed the strides of its output slot_mapping from (1,) to (0,)"),
    "replaced by int32 data": (lambda out: setattr(out, "data", torch.zeros(7, dtype=torch.int32)),
                               "the kernel changed the dtype of its output slot_mapping from int64 to int32"),
    "its storage grown": (lambda out: out.untyped_storage().resize_(100),
                          "the kernel changed the memory of its output slot_mapping: it no longer views the buffer "
                          "it was handed"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_output_is_named_with_what_changed(change):
    args = slot_call()
    handed = Handed.of(SLOT_MAPPING, args)
    do, said = CHANGES[change]
    do(args[3])
    assert handed.changed() == said
    with pytest.raises(Discrepancy) as raised:
        handed.check("slot mapping", group=0, rank=1)
    assert str(raised.value) == f"group 0 rank 1 slot mapping: {said}"


def test_writing_into_every_tensor_changes_nothing():
    args = slot_call()
    handed = Handed.of(SLOT_MAPPING, args)
    for tensor in args:
        tensor.fill_(3)
    assert handed.changed() is None
    handed.check("slot mapping")


def test_an_input_and_a_list_argument_are_named_by_the_contract():
    table = torch.zeros((2, 3), dtype=torch.int32)
    args = (torch.zeros(3), torch.zeros(3), table, torch.zeros(2, dtype=torch.int32), torch.zeros(4), torch.zeros(4))
    handed = Handed.of(KV_CONTRACTS["gather"], args)
    table.resize_(6)
    assert handed.changed() == "the kv-gather kernel changed the shape of its input block_table from (2, 3) to (6,)"
    caches = [torch.zeros((2, 4)), torch.zeros((2, 4))]
    handed = Handed.of(KV_CONTRACTS["copy"], (caches, [torch.zeros((2, 4))], torch.zeros((1, 2), dtype=torch.int64)))
    caches[1].t_()
    assert handed.changed() == "the kv-copy kernel changed the shape of its output key_caches[1] from (2, 4) to (4, 2)"
