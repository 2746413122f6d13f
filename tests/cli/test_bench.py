"""`blocktable bench` labels what it measures honestly: without a GPU it says first
that interpreter wall times are not timings and computes no speed-up; on a GPU its
tables name the baseline by what it is (vLLM's per-request design and compile-time
choices) and rank the other kernels against it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from blocktable.cli.bench import BASELINE, LABELS, Row, render_markdown


@pytest.mark.interpreted_loops
def test_without_a_gpu_the_first_line_says_the_times_are_not_timings(tmp_path):
    # A fresh process: the interpreter must be chosen before any kernel module loads.
    run = subprocess.run([sys.executable, "-m", "blocktable.cli.main", "bench", "--quick", "--device", "cpu",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    first = run.stdout.splitlines()[0]
    assert first.startswith("WARNING: No GPU") and "not timings" in first, first
    assert "vs per-request" not in run.stdout and "×" not in run.stdout and "GB/s" not in run.stdout
    assert LABELS[BASELINE] in run.stdout
    written = (tmp_path / "results.md").read_text()
    assert written.startswith("WARNING: No GPU") and "vs per-request" not in written


def _rows(kernel: str, us: float) -> Row:
    return Row("decode-256", 1, 1, kernel, 256, 256, us, 4096, True)


def test_on_a_gpu_the_table_names_the_baseline_and_ranks_against_it():
    meta = {"device": "NVIDIA H200", "timed": True, "numpy": "2", "date": "2026-01-01", "copy_gbps": 4000.0,
            "K": 16, "B": 16}
    table = render_markdown([_rows(BASELINE, 4.0), _rows("triton-tiled", 2.0)], meta)
    assert "× vs per-request" in table
    assert f"| {LABELS[BASELINE]} |" in table and "constexpr" in LABELS[BASELINE]
    assert "| 2.00× |" in table  # the tiled kernel, twice as fast as the baseline
    assert "WARNING" not in table


def test_kv_plug_ins_are_timed_beside_ours_and_a_wrong_one_is_not_timed(tmp_path):
    """`bench --suite kv`: each KV plug-in runs from the same buffers as ours and is
    compared with it bit for bit first; a gather reading one token late differs."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    late = tmp_path / "late_gather.py"
    late.write_text((examples / "torch_kv_gather.py").read_text().replace("j % block_size", "(j + 1) % block_size"))
    run = subprocess.run([sys.executable, "-m", "blocktable.cli.main", "bench", "--device", "cpu", "--suite", "kv",
                          "--kv-write", f"{examples}/torch_kv_write.py:write", "--kv-gather", f"{late}:gather",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    table = (tmp_path / "out" / "results.md").read_text()
    assert "| write 8 tokens, 2x8 bfloat16 NHD | torch_kv_write.py:write | " in table
    assert "OUTPUTS DIFFER (late_gather.py:gather vs triton): not timed" in table
    assert "| copy 4 pairs x 2 layers, 2x8 bfloat16 NHD | torch |" in table  # the torch-native baseline
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["kv_rows"]
    assert {r["kernel"] for r in rows} == {"triton", "torch", "torch_kv_write.py:write", "late_gather.py:gather"}
    assert not [r for r in rows if r["kernel"] == "torch_kv_write.py:write" and not r["ok"]]


def test_a_vllm_plug_in_or_a_named_baseline_gets_a_column_of_its_own():
    meta = {"device": "NVIDIA H200", "timed": True, "numpy": "2", "date": "2026-01-01", "copy_gbps": 4000.0,
            "K": 16, "B": 16, "reference": "/x/vllm_slots.py:slot_mapping"}
    rows = [_rows(BASELINE, 4.0), _rows("triton-tiled", 2.0), _rows("/x/vllm_slots.py:slot_mapping", 3.0)]
    table = render_markdown(rows, meta)
    assert "| × vs per-request | × vs vllm_slots.py:slot_mapping |" in table
    assert "Reference: vllm_slots.py:slot_mapping." in table
    assert "| 2.00× | 1.50× |" in table  # the tiled kernel against the baseline, then against the plug-in
    assert "| 1.33× | 1.00× |" in table  # the plug-in itself
    assert "/x/" not in table  # a plug-in by its file's name, not its path
    plain = render_markdown(rows, {**meta, "reference": None})
    assert "× vs vllm" not in plain and "| 2.00× |" in plain


@pytest.mark.interpreted_loops
def test_the_baseline_option_times_the_plug_in_and_names_it(tmp_path):
    examples = Path(__file__).resolve().parents[2] / "examples"
    run = subprocess.run([sys.executable, "-m", "blocktable.cli.main", "bench", "--device", "cpu", "--suite", "slot",
                          "--baseline", f"{examples}/numpy_slot_mapping.py:slot_mapping", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["meta"]["reference"].endswith("numpy_slot_mapping.py:slot_mapping")
    timed = {r["kernel"] for r in results["rows"]}
    assert results["meta"]["reference"] in timed and all(r["ok"] for r in results["rows"])
