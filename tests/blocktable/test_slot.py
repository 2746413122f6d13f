"""The slot-mapping launchers' host arithmetic: the multipliers that let the tiled kernel
divide by run-time sizes without a division (blocktable/slot.py), checked against
Python's own integer division, and when the launcher gives them up."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blocktable.slot import MAGIC_LIMIT, division_args, multiplier

DIVISORS = st.one_of(st.integers(1, 4096), st.integers(1, 2**31 - 1),
                     st.integers(0, 30).map(lambda k: 2**k), st.integers(1, 31).map(lambda k: 2**k - 1))


@given(d=DIVISORS, n=st.integers(0, 2**31 - 1))
def test_the_multiplier_divides_exactly(d, n):
    m, s = multiplier(d)
    assert 2**31 <= m < 2**32  # one Triton type (int64) for every divisor, and n * m < 2**63
    assert (n * m) >> s == n // d


@given(d=DIVISORS, k=st.integers(0, 2**31 - 1))
def test_the_multiplier_is_exact_on_both_sides_of_every_multiple(d, k):
    """Where a rounded-down multiplier or a short shift would fail first: n = k*d and k*d - 1."""
    m, s = multiplier(d)
    for n in (k * d - 1, k * d):
        if 0 <= n < 2**31:
            assert (n * m) >> s == n // d


def test_a_divisor_below_one_is_refused():
    with pytest.raises(ValueError, match="divisor must be >= 1"):
        multiplier(0)


def test_the_limit_is_the_first_position_past_the_row():
    # K = 32, B = 16 (P = 2), W = 2: a virtual block is 64 positions and two columns;
    # a row of 5 columns ends inside the third virtual block, so 3 * 64 = 192.
    args, magic = division_args(32, 16, 2, 1, 5)
    assert magic and args[0] == 192
    assert args[1:] == [*multiplier(64), *multiplier(1), *multiplier(2), *multiplier(16)]


def test_rows_mapping_2_31_positions_divide_plainly():
    assert division_args(2**29, 2**29, 1, 1, 4) == ([0] * 9, False)  # exactly 2**31 positions
    args, magic = division_args(2**29, 2**29, 1, 1, 3)
    assert magic and args[0] == 3 * 2**29 < MAGIC_LIMIT
