"""The comparisons (properties/compare.py): any one differing element, in any
integer or boolean dtype and in any layout, fails with its index and both values."""

import numpy as np
import pytest

from blocktable.properties.compare import Discrepancy, assert_arrays_equal, same_values


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
