"""The vectorized reading of docs/contract.md §4 equals the token-by-token reference, in numpy
and in torch, before anything relies on it."""

import numpy as np
import torch
from hypothesis import given

from blocktable.properties.slot import draw as strategies
from blocktable.properties.slot.examples import SPEC_EXAMPLES
from blocktable.properties.slot.truth import slot_mapping_vectorized
from blocktable.reference import slot_mapping


@given(case=strategies.slot_cases(max_requests=8, max_query=40))
def test_equals_the_reference_in_numpy_and_torch(case):
    args = (case.query_start_loc, case.positions, case.block_table, case.max_num_tokens)
    expected = slot_mapping(*args, **case.config.kwargs())
    assert np.array_equal(slot_mapping_vectorized(*args, **case.config.kwargs()), expected)
    tensors = [torch.from_numpy(a) for a in args[:3]]
    got = slot_mapping_vectorized(*tensors, case.max_num_tokens, **case.config.kwargs())
    assert got.dtype == torch.int64 and np.array_equal(got.numpy(), expected)


def test_spec_examples():
    for example in SPEC_EXAMPLES:
        qsl, pos, table = example.inputs()
        got = slot_mapping_vectorized(qsl, pos, table, example.tmax, **example.kwargs())
        assert np.array_equal(got, example.expected_mapping()), example.name
