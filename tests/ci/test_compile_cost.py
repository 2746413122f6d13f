"""`ci/compile_cost.py`: one fuzzing child in-process with Triton's first-use work
timed. Here (no GPU) it can show only that the run and its report work; what it times
happens on a GPU. A budget of programs, not seconds: a loaded machine may not finish
one program in a few seconds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "ci" / "compile_cost.py"


@pytest.mark.fuzz
def test_a_short_run_reports_its_steps_and_that_the_interpreter_compiles_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKTABLE_")} | {"BLOCKTABLE_KV_WORLDS": "0"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--examples", "3", "--device", "cpu"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    said = re.fullmatch(r"\{'BLOCKTABLE_KV_WORLDS': '0'\}: (\d+) checked steps in [\d.]+ s = [\d.]+/s; "
                        r"the interpreter compiles nothing\n", done.stdout)
    assert said and int(said.group(1)) > 0, done.stdout
