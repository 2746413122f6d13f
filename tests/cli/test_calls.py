"""A run that never called a plug-in it was given does not pass: the summary counts
each kernel's calls, and a named plug-in with none is exit 2 with the reason, not
a pass that checked nothing of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from blocktable.properties.run.calls import calls, calls_text, counted, counting, never_called

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
WRITE = f"{EXAMPLES / 'torch_kv_write.py'}:write"
COPY = f"{EXAMPLES / 'torch_kv_copy.py'}:copy_blocks"


def test_a_counted_kernel_counts_its_calls_and_unwraps_to_itself():
    import inspect

    def kernel(a, b=0):
        return a + b

    wrapped = counted("kv-test", kernel)
    before = calls().get("kv-test", 0)
    assert wrapped(1, b=2) == 3 and wrapped(5) == 5
    assert calls()["kv-test"] == before + 2
    assert inspect.unwrap(wrapped) is kernel and wrapped.__name__ == "kernel"


def test_every_kernel_of_a_run_counts_under_its_flag(kernels):
    plugins = counting(kernels("reference"))
    before = calls()
    for kind in ("write", "copy", "gather"):
        assert getattr(plugins.kv, kind) is not getattr(kernels("reference").kv, kind)
    assert plugins.slot.__wrapped__ is not None and plugins.kv.specs == kernels("reference").kv.specs
    with pytest.raises(TypeError):
        plugins.kv.copy()  # called with nothing: it still counts as a call
    assert calls()["kv-copy"] == before.get("kv-copy", 0) + 1


def test_the_reason_names_every_plugin_never_called():
    named = {"kernel": "triton", "kv-write": "w.py:write", "kv-copy": "c.py:copy"}
    assert never_called(named, {"kernel": 9, "kv-write": 1, "kv-copy": 2}, 5) is None
    reason = never_called(named, {"kernel": 9, "kv-write": 0}, 5)
    assert reason is not None and reason.startswith("--kv-write w.py:write, --kv-copy c.py:copy were never called "
                                                    "in 5 programs")
    assert calls_text({"kv-gather": 3, "kernel": 1200}, ["kv-write"]) == "kernel 1,200; kv-write 0; kv-gather 3"


@pytest.mark.fuzz
def test_a_kv_plugin_no_world_called_is_a_usage_error_not_a_pass(cli, monkeypatch):
    monkeypatch.setenv("BLOCKTABLE_KV_WORLDS", "0")  # no lockstep world keeps KV caches: nothing calls it
    code, out = cli("fuzz", "--kv-copy", COPY, "--device", "cpu", "--examples", "3")
    assert code == 2, out
    assert "no discrepancy found" not in out and "kv-copy 0" in out
    reason = [line for line in out.splitlines() if line.startswith("blocktable fuzz: ")]
    # Programs run: the three asked for, and any Hypothesis ran besides (one it discarded).
    assert len(reason) == 1 and re.fullmatch(
        rf"blocktable fuzz: --kv-copy {re.escape(COPY)} was never called in [3-9] programs \(nothing drawn used "
        rf"it\), so this run checked nothing of it: run more \(--examples, --minutes\) or another --seed",
        reason[0]), out


@pytest.mark.fuzz
def test_the_summary_counts_the_calls_of_each_plugin(cli):
    # Ten programs: seed 0's first KV world with a copy-on-write comes within them.
    code, out = cli("fuzz", "--kv-write", WRITE, "--kv-copy", COPY, "--device", "cpu", "--examples", "10")
    assert code == 0, out
    row = next(line for line in out.splitlines() if "calls (shrinking included)" in line)
    counts = dict(part.strip().rsplit(" ", 1) for part in row.split("│")[2].split(";"))
    assert {"kernel", "kv-write", "kv-copy", "kv-gather"} <= set(counts), row  # ours too (and the V2 worlds')
    assert all(int(n.replace(",", "")) > 0 for n in counts.values()), row
    assert "no discrepancy found" in out
