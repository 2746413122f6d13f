"""blocktable/interpreter.py: what we take out of Triton's interpreter leaves every
value a kernel computes as it was."""

from __future__ import annotations

import pytest
import torch

from blocktable import interpreter


def test_the_interpreter_skips_only_overflow_checks_it_would_discard(backend):
    """Under the interpreter, 32-bit integer arithmetic is not redone in int64 for an
    assertion the interpreter drops (its `debug` option is off), and it still wraps
    as on a GPU: the values a kernel computes are those it computed before."""
    import triton
    import triton.language as tl

    if not backend.interpreted:
        pytest.skip("the interpreter's option; compiled kernels drop the dead checks themselves")
    from triton.runtime import interpreter as triton_interpreter

    options = triton_interpreter.interpreter_builder.options
    assert not options.debug and not options.sanitize_overflow
    assert interpreter.skip_unasserted_overflow_checks() is False  # already off: nothing to do

    @triton.jit
    def wrap(x_ptr, out_ptr):
        x = tl.load(x_ptr + tl.arange(0, 4))
        tl.store(out_ptr + tl.arange(0, 4), x * 3 + x)

    x = torch.tensor([2**30, -2**30, 2**31 - 1, 5], dtype=torch.int32)
    out = torch.zeros_like(x)
    wrap[(1,)](x, out)
    expected = ((x.to(torch.int64) * 4 + 2**31) % 2**32 - 2**31).to(torch.int32)
    assert torch.equal(out, expected)


def test_the_interpreter_patches_the_language_once_per_process(backend, monkeypatch):
    """Under the interpreter, once a launch has patched triton.language it stays
    patched: no later launch, and no `@triton.jit` helper called inside one, walks it
    again; the kernels still compute with the interpreted operations."""
    import inspect

    import triton
    import triton.language as tl

    if not backend.interpreted:
        pytest.skip("the interpreter's patching; compiled kernels have none")
    assert interpreter.patch_the_language_once_per_process() is True  # installed by select(): idempotent

    @triton.jit
    def triple(x):
        return x * 3

    monkeypatch.setitem(globals(), "triple", triple)  # a kernel finds its helpers in its module

    @triton.jit
    def with_helpers(x_ptr, out_ptr):
        x = tl.load(x_ptr + tl.arange(0, 4))
        tl.store(out_ptr + tl.arange(0, 4), triple(triple(x)) + triple(x))

    @triton.jit
    def inline(x_ptr, out_ptr):
        x = tl.load(x_ptr + tl.arange(0, 4))
        tl.store(out_ptr + tl.arange(0, 4), x * 9 + x * 3)

    walks = []
    getmembers = inspect.getmembers
    monkeypatch.setattr(inspect, "getmembers", lambda *a, **k: walks.append(1) or getmembers(*a, **k))
    x = torch.tensor([1, -2, 7, 2**20], dtype=torch.int32)
    counts, outs = [], []
    for kernel in (inline, with_helpers, inline):  # the first may walk, if no test here launched before
        walks.clear()
        out = torch.zeros_like(x)
        kernel[(1,)](x, out)
        counts.append(len(walks))
        outs.append(out)
        assert not tl.core.is_builtin(tl.load)  # still the interpreted version after the launch
    assert counts[1:] == [0, 0], counts  # a launch, and three helper calls, with no walk
    assert all(torch.equal(out, x * 12) for out in outs), outs
