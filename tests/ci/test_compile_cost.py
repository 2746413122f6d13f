"""`ci/compile_cost.py`: one fuzzing child in-process with Triton's first-use work
timed. Here (no GPU) it can show only that the run and its report work; what it times
happens on a GPU."""

from __future__ import annotations

import re

import pytest


@pytest.mark.fuzz
def test_a_short_run_reports_its_steps_and_that_the_interpreter_compiles_nothing(timing_script):
    output = timing_script("compile_cost.py")
    said = re.fullmatch(r"\{'BLOCKTABLE_KV_WORLDS': '0'\}: (\d+) checked steps in [\d.]+ s = [\d.]+/s; "
                        r"the interpreter compiles nothing\n", output)
    assert said and int(said.group(1)) > 0, output
