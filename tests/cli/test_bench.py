"""`blocktable bench` labels what it measures honestly: without a GPU it says first
that interpreter wall times are not timings and computes no speed-up; on a GPU its
tables name the baseline by what it is (vLLM's per-request design and compile-time
choices) and rank the other kernels against it."""

from __future__ import annotations

import subprocess
import sys

from blocktable.cli.bench import BASELINE, LABELS, Row, render_markdown


def test_without_a_gpu_the_first_line_says_the_times_are_not_timings(tmp_path):
    # A fresh process: the interpreter must be chosen before any kernel module loads.
    run = subprocess.run([sys.executable, "-m", "blocktable.cli.main", "bench", "--quick", "--device", "cpu",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
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
