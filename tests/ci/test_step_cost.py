"""`ci/step_cost.py`: the same seeded programs twice in one process, the second pass
timed. What it promises is that the two passes ran the same programs (else the time
is not a step's cost), and it stops with an error where they did not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "step_cost.py"


@pytest.mark.fuzz
def test_the_timed_pass_runs_the_programs_of_the_compiling_pass(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKTABLE_")} | {"BLOCKTABLE_KV_WORLDS": "0"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--examples", "3", "--device", "cpu"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    said = re.fullmatch(r"\{'BLOCKTABLE_KV_WORLDS': '0'\}: (\d+) checked steps a pass; compiling pass [\d.]+ s, "
                        r"timed pass [\d.]+ s = [\d.]+ checked steps/s \([\d.]+ ms a step\)\n", done.stdout)
    assert said and int(said.group(1)) > 0, done.stdout
