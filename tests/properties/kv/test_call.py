"""Running one KV call behind guards (properties/kv_calls.py, kv_buffers.py): correct
kernels pass; a kernel that writes outside its caches, changes an input, takes the
token count from the padded key, or writes a wrong element fails with a message
that names it; shrinking finds the one failing token; the case-file schema refuses
what it cannot replay."""

import numpy as np
import pytest
import torch

from blocktable import device
from blocktable.kv_torch import copy_blocks_torch, gather_torch, write_torch
from blocktable.properties.cases.case import Case, CaseError
from blocktable.properties.kv.call import check_call, run_kv_call
from blocktable.properties.kv.draw import candidates, draw, shrink

DEVICE = device.current().device  # the suite's backend: the GPU where there is one
OURS = {"write": write_torch, "copy": copy_blocks_torch, "gather": gather_torch}


def calls(op, count, seed=3, **limits):
    rng = np.random.default_rng(seed)
    return [draw(op, rng, limits.get("max_elements", 4096), limits.get("max_tokens", 40)) for _ in range(count)]


@pytest.mark.parametrize("op", ["write", "copy", "gather"])
def test_a_correct_kernel_passes_every_call(op):
    for call in calls(op, 40):
        outcome = run_kv_call(call, OURS[op], DEVICE)
        assert outcome.passed, outcome.error


def first_failure(op, kernel, count=60):
    for call in calls(op, count):
        outcome = run_kv_call(call, kernel, DEVICE)
        if not outcome.passed:
            return call, outcome.error
    raise AssertionError(f"no call of {count} caught the kernel")


def test_a_write_before_the_cache_hits_the_guard():
    def stray(key, value, key_cache, value_cache, slot_mapping, **kw):
        write_torch(key, value, key_cache, value_cache, slot_mapping, **kw)
        torch.as_strided(key_cache, (1,), (1,), key_cache.storage_offset() - 1).view(torch.uint8).fill_(0x55)

    _, error = first_failure("write", stray)
    assert "guard" in error.what and "the kernel wrote outside its tensors" in str(error)


def test_a_kernel_that_changes_its_input_is_caught():
    def scribble(key, value, key_cache, value_cache, slot_mapping, **kw):
        write_torch(key, value, key_cache, value_cache, slot_mapping, **kw)
        if key.shape[0]:
            key[-1].view(torch.uint8).fill_(0x33)

    _, error = first_failure("write", scribble)
    assert "the kernel wrote into an input" in str(error)


def test_the_token_count_taken_from_the_padded_key_is_caught():
    """vLLM #13418: rows past len(slot_mapping) are padding; a kernel that loops over
    key.shape[0] reads slots past the mapping (the guard holds valid slots) and writes them."""
    def from_key(key, value, key_cache, value_cache, slot_mapping, **kw):
        every = torch.as_strided(slot_mapping, (key.shape[0],), slot_mapping.stride())
        write_torch(key, value, key_cache, value_cache, every.clone(), **kw)

    call, error = first_failure("write", from_key)
    assert call["rows"] > len(call["slot_mapping"])
    assert "no token writes this slot: it must not change" in str(error) or "raised" in str(error)


def test_a_wrong_element_decodes_and_shrinks_to_its_token():
    def skips_slot_zero(key, value, key_cache, value_cache, slot_mapping, **kw):
        write_torch(key, value, key_cache, value_cache, torch.where(slot_mapping == 0, -1, slot_mapping), **kw)

    call, error = first_failure("write", skips_slot_zero)
    assert "(slot 0; token " in str(error) and "the kernel did not write it" in str(error)
    small = shrink(call, error, skips_slot_zero, DEVICE)
    assert small["slot_mapping"] == [0] and small["name"] == "stateless-write-token"
    assert small["rows"] == 1 + call["rows"] - len(call["slot_mapping"])  # the padding rows kept
    assert not run_kv_call(small, skips_slot_zero, DEVICE).passed
    assert run_kv_call(small, write_torch, DEVICE).passed


def test_gather_and_copy_failures_shrink_to_one_request_and_one_pair():
    def one_past(key_cache, value_cache, block_table, cu_lens, out_key, out_value, **kw):
        gather_torch(key_cache, value_cache, block_table, cu_lens, out_key, out_value, **kw)
        end = int(cu_lens[-1])
        if end < out_key.shape[0]:
            out_key[end].zero_()

    call, error = first_failure("gather", one_past)
    assert "past cu_lens[N]" in str(error)
    small = shrink(call, error, one_past, DEVICE)
    assert len(small["cu_lens"]) == 2 and small["name"] == "stateless-gather-request"

    def skips_last_pair(key_caches, value_caches, block_mapping):
        copy_blocks_torch(key_caches, value_caches, block_mapping[:-1])

    call, error = first_failure("copy", skips_last_pair)
    assert "becomes a copy of block" in str(error)
    small = shrink(call, error, skips_last_pair, DEVICE)
    assert len(small["block_mapping"]) == 1 and small["name"].startswith("stateless-copy-pair")


def test_candidates_end_with_the_whole_call():
    call = calls("gather", 1)[0]
    assert candidates(call, None)[-1]["cu_lens"] == call["cu_lens"]


def test_the_case_schema_refuses_what_cannot_replay():
    call = calls("write", 5)[-1]
    data = {"format": "blocktable-case", "version": 2, "kind": "kv-call", "kernel": "torch", "failure": {},
            "call": call, "world": None, "program": [], "confirmation": None, "provenance": {}}
    assert Case.from_json(data).call == call
    for change, message in [({"op": "read"}, "'op' must be one of"), ({"layout": "NDH"}, "'layout'"),
                            ({"k_scale": 0.0}, "'k_scale' must be a finite number > 0"),
                            ({"rows": len(call["slot_mapping"]) - 1}, "'rows' must be"),
                            ({"key": [1, 2]}, "'key' must be"),
                            ({"slot_mapping": [10**9] + call["slot_mapping"][1:]}, "lies outside the cache")]:
        if "rows" in change and not call["slot_mapping"]:
            continue
        with pytest.raises(CaseError, match=message):
            Case.from_json({**data, "call": {**call, **change}})
    copy = calls("copy", 8)[-1]
    with pytest.raises(ValueError, match="destinations"):
        check_call({**copy, "block_mapping": [[0, 1], [1, 0]]})
    gather = calls("gather", 3)[-1]
    with pytest.raises(ValueError, match="'cu_lens'"):
        check_call({**gather, "cu_lens": [1, 0]})
