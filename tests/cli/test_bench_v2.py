"""The V2 block-table benchmark (`blocktable bench --suite v2`) on tiny steps, under the
interpreter on a CPU: every buffer it hands the kernels is what §10 says (ours and the
torch-native twins, run on them, give the reference's outputs bit for bit), every op
runs every implementation and reports, a plug-in that differs or raises is reported
and not timed, and wrong flags are usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from blocktable.cli import bench_v2
from blocktable.cli.bench_v2_step import Step, build
from blocktable.reference.v2 import BlockTables as ReferenceTables

IMPLEMENTATIONS = ("triton", "torch")


def _host(t: torch.Tensor) -> np.ndarray:
    return t.cpu().numpy().copy()


def reference_outputs(step: Step, op: str) -> list[np.ndarray]:
    """The buffers `op` writes, as the reference leaves them when it starts from the step's state."""
    ref = ReferenceTables(**step.config)  # every group sharded and enabled, as the bench passes them
    ref.rows = [_host(r) for r in step.rows]
    ref.inp = [_host(i) for i in step.inp]
    ref.slots = _host(step.slots)
    if op == "append":
        ref.cnt, ref.cnt_dev = _host(step.cnt), _host(step.cnt_before)
        s = {k: _host(v) for k, v in step.staged.items()}
        ref.staged = [(int(g), int(r), int(start), [int(i) for i in s["ids"][s["cu"][w]:s["cu"][w + 1]]])
                      for w, (g, r, start) in enumerate(zip(s["group"], s["row"], s["start"]))]
        ref.apply_staged_writes()
        return [*ref.rows, ref.cnt_dev]
    ref.cnt_dev = _host(step.cnt)  # the counts as of this step's apply
    if op == "gather":
        ref.gather_block_tables(_host(step.idx_mapping), step.num_reqs_padded)
        return ref.inp
    ref.compute_slot_mappings(_host(step.idx_mapping), _host(step.query_start_loc), _host(step.positions),
                              step.num_tokens_padded)
    return [ref.slots]


CALLS = [(shape, op, per_group) for shape in bench_v2.TINY_SHAPES for op in bench_v2.OPS
         for per_group in ([False, True] if op == "slots" and shape.groups > 1 else [False])]


@pytest.mark.parametrize("shape, op, per_group", CALLS,
                         ids=lambda x: x.label() if hasattr(x, "label") else str(x))
def test_the_buffers_the_bench_passes_give_the_reference_outputs(backend, shape, op, per_group):
    step = build(shape, backend.device)
    expected = reference_outputs(step, op)
    prepared = bench_v2.prepare(step, op, per_group)
    before = [_host(t) for t in prepared.state]
    assert len(before) == len(expected)
    # The step is no no-op: the call changes its buffers, and (the gather) keeps some stale entries.
    assert not all(np.array_equal(b, e) for b, e in zip(before, expected))
    if op == "gather":  # stale entries past the counts stay, and so do the rows past num_reqs_padded
        n = step.num_reqs_padded
        assert any((b[:n] == e[:n]).any() and np.array_equal(b[n:], e[n:]) and len(b) > n
                   for b, e in zip(before, expected))
    for name, fn in bench_v2.implementations(op).items():
        state = [t.clone() for t in prepared.state]
        prepared.call(fn, state)
        for buffer, got, want in zip(prepared.names, state, expected):
            got = got.cpu().numpy()
            assert got.dtype == want.dtype and np.array_equal(got, want), (name, buffer, np.argwhere(got != want)[:5])


def test_the_tiny_suite_runs_every_implementation_and_they_agree(backend):
    rows = bench_v2.run_suite(backend, bench_v2.TINY_SHAPES)
    expected = []
    for shape in bench_v2.TINY_SHAPES:
        for op in bench_v2.OPS:
            expected += [(shape.label(), op, name, 1) for name in IMPLEMENTATIONS]
            if op == "slots" and shape.groups > 1:  # the launch comparison
                expected += [(shape.label(), op, name, shape.groups) for name in IMPLEMENTATIONS]
    assert [(r.case, r.op, r.kernel, r.calls) for r in rows] == expected
    assert any(shape.groups > 1 for shape in bench_v2.TINY_SHAPES)
    assert all(r.ok and r.microseconds is not None and r.bytes > 0 and r.note.find("DIFFER") < 0 for r in rows)
    text = bench_v2.render_markdown(rows, backend.describe(), timed=not backend.interpreted)
    if backend.interpreted:
        assert {r.timing for r in rows} == {"interpreter"}
        assert "not timings" in text and "GB/s" not in text and "vs torch" not in text
        assert text.count("\n| ") == len(rows) + 2  # the header, its rule and one line a row


def _row(case: str, op: str, kernel: str, us: float, calls: int = 1, timing: str = "cuda-graph",
         note: str = "") -> bench_v2.V2Row:
    return bench_v2.V2Row(case, op, kernel, calls, 4, 256, 256, us, 4000, True, timing, note)


def test_on_a_gpu_the_tables_give_ratios_vs_torch_and_one_call_vs_one_per_group():
    rows = [_row("decode-256, 4 groups", "append", "triton", 2.0),
            _row("decode-256, 4 groups", "append", "torch", 8.0, timing="plain launches",
                 note="no CUDA graph (RuntimeError): plain launches"),
            _row("decode-256, 4 groups", "slots", "triton", 3.0),
            _row("decode-256, 4 groups", "slots", "torch", 6.0),
            _row("decode-256, 4 groups", "slots", "triton", 9.0, calls=4),
            _row("decode-256, 4 groups", "slots", "torch", 12.0, calls=4)]
    text = bench_v2.render_markdown(rows, "NVIDIA H200", timed=True)
    assert "| decode-256, 4 groups | append | triton | 2.00 | 2 | 4.00x | cuda-graph |  |" in text
    assert "| decode-256, 4 groups | append | torch | 8.00 | 0 | 1.00x | plain launches | no CUDA graph" in text
    assert "| decode-256, 4 groups | slots | triton | 3.00 | 1 | 2.00x | cuda-graph |  |" in text
    assert "| decode-256, 4 groups | triton | 3.00 | 9.00 | 3.00x | cuda-graph |  |" in text
    assert "| decode-256, 4 groups | torch | 6.00 | 12.00 | 2.00x | cuda-graph |  |" in text
    assert "not timings" not in text


STALE_TAIL_ZEROED = '''
def gather(rows, cnt_dev, inp, idx_mapping, num_reqs_padded):
    """Whole rows, zeros past the count: inp[b, n:] must keep its stale entries instead."""
    for g, (src, dst) in enumerate(zip(rows, inp)):
        dst[:num_reqs_padded] = 0
        for b, r in enumerate(idx_mapping.tolist()):
            if r >= 0:
                n = int(cnt_dev[g, r])
                dst[b, :n] = src[r, :n]
'''
TORCH_SLOTS = '''
from blocktable.v2_torch import slot_mappings_torch


def slots(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **keywords):
    slot_mappings_torch(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **keywords)
'''
REFUSES = '''
def append(rows, cnt_dev, cnt, staged_group, staged_row, staged_start, staged_ids, cu_staged):
    raise NotImplementedError("no staged writes here")
'''


@pytest.mark.interpreted_loops
def test_a_plug_in_that_differs_is_refused_before_timing_and_one_that_agrees_is_timed(tmp_path):
    for name, source in (("zero_tail.py", STALE_TAIL_ZEROED), ("torch_slots.py", TORCH_SLOTS),
                         ("refuses.py", REFUSES)):
        (tmp_path / name).write_text(source)
    out = tmp_path / "out"
    # A fresh process: the interpreter must be chosen before any kernel module loads.
    # Not in the checkout's root, where `-m` would import its bare blocktable/ folder.
    run = subprocess.run([sys.executable, "-m", "blocktable.cli.main", "bench", "--device", "cpu", "--suite", "v2",
                          "--v2-gather", f"{tmp_path}/zero_tail.py:gather", "--v2-slots",
                          f"{tmp_path}/torch_slots.py:slots", "--v2-append", f"{tmp_path}/refuses.py:append",
                          "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.startswith("WARNING: No GPU")
    rows = json.loads((out / "results.json").read_text())["v2_rows"]
    assert not json.loads((out / "results.json").read_text())["rows"]  # --suite v2: nothing else
    by = {(r["case"], r["op"], r["kernel"], r["calls"]): r for r in rows}
    for shape in bench_v2.TINY_SHAPES:
        case = shape.label()
        wrong = by[(case, "gather", "zero_tail.py:gather", 1)]
        assert not wrong["ok"] and wrong["microseconds"] is None and wrong["timing"] == ""
        assert wrong["note"].startswith("OUTPUTS DIFFER (zero_tail.py:gather vs triton: inp[0] differs in ")
        assert wrong["note"].endswith(", found 0): not timed")
        refused = by[(case, "append", "refuses.py:append", 1)]
        assert not refused["ok"] and refused["note"] == "RAISED NotImplementedError: no staged writes here"
        for calls in {1, shape.groups}:
            agrees = by[(case, "slots", "torch_slots.py:slots", calls)]
            assert agrees["ok"] and agrees["microseconds"] is not None and agrees["timing"] == "interpreter"
        assert all(by[(case, op, name, 1)]["ok"] for op in bench_v2.OPS for name in IMPLEMENTATIONS)
    table = (out / "results.md").read_text()
    assert "## V2 block tables" in table and "OUTPUTS DIFFER (zero_tail.py:gather vs triton" in table


@pytest.mark.parametrize("args, message", [
    (["--v2-append", "nope"], "unknown v2-append kernel 'nope': use one of triton, torch, MODULE:FUNCTION"),
    (["--v2-slots", "missing.py:fn"], "v2-slots kernel file missing.py does not exist"),
    (["--v2-gather", "folder.py:fn"], "v2-gather kernel file folder.py is a folder"),
    (["--v2-gather", "kernel.py"], "v2-gather kernel 'kernel.py' names a file but no function"),
    (["--v2-append", "kernel.py:nothing"], "kernel.py has no function 'nothing'"),
    (["--v2-append", "kernel.py:slot_mapping"],
     "kernel.py:slot_mapping does not follow the plug-in contract: it takes 4 positional arguments, the contract "
     "passes 8"),
    (["--suite", "v3"], "invalid choice: 'v3'"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_a_wrong_v2_flag_exits_2_naming_it_before_anything_runs(cli, tmp_path, args, message):
    (tmp_path / "folder.py").mkdir()
    (tmp_path / "kernel.py").write_text("def slot_mapping(a, b, c, d, **kw):\n    pass\n")
    code, output = cli("bench", *args, "--out", "bench-out")
    assert code == 2 and message in output, output
    assert "Traceback" not in output and "WARNING" not in output
    assert not Path("bench-out").exists()
