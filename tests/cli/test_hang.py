"""A kernel call that does not return is a finding: the parent's watchdog stops the
process after --call-timeout seconds, the program becomes a case as a crash's
journal does, confirmed in a fresh process (which hangs and is stopped again), and
`replay` reports the same instead of hanging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blocktable.properties.run.calls import calls, counted, watch
from blocktable.properties.run.child import HUNG_EXIT, describe_exit

pytestmark = pytest.mark.fuzz

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "numpy_slot_mapping.py"
BODY = "    K, B, W, R, I = kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave\n"
HANG = "    if positions.numel() >= 6:  # a call this big never returns\n        time.sleep(3600)\n"
SAID = "had a kernel call that did not return within 2 s (--call-timeout), and was stopped"


def test_a_counted_call_stamps_when_it_started_and_clears_it_after():
    class Beat:
        value = 0.0

    seen = []
    beat = Beat()
    watch(beat)
    try:
        counted("kv-test", lambda: seen.append(beat.value))()
    finally:
        watch(None)
    assert seen[0] > 0 and beat.value == 0.0 and calls()["kv-test"] >= 1
    assert describe_exit(HUNG_EXIT, 2.0) == SAID


def test_a_hanging_kernel_is_a_finding_with_a_case_that_replays_the_hang(cli, tmp_path):
    source = EXAMPLE.read_text()
    assert source.count(BODY) == 1
    (tmp_path / "hangs.py").write_text("import time\n\n" + source.replace(BODY, HANG + BODY))
    spec = f"{tmp_path / 'hangs.py'}:slot_mapping"
    code, out = cli("fuzz", "--kernel", spec, "--device", "cpu", "--examples", "5", "--call-timeout", "2")
    assert code == 1, out
    assert f"the process running the kernel {SAID} while running" in out, out
    assert "confirmed: it fails again when replayed alone in a fresh process" in out, out
    case = Path(out.split("case file: ")[1].split()[0])
    data = json.loads(case.read_text())
    assert data["kind"] == "slot-call" and data["failure"]["what"] == "crash" and SAID in data["failure"]["message"]
    code, replayed = cli("replay", str(case), "--call-timeout", "2")
    assert code == 1 and SAID in replayed, replayed
