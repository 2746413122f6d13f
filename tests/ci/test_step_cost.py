"""`ci/step_cost.py`: the same seeded programs twice in one process, the second pass
timed. What it promises is that the two passes ran the same programs (else the time
is not a step's cost), and it stops with an error where they did not."""

from __future__ import annotations

import re

import pytest


@pytest.mark.fuzz
def test_the_timed_pass_runs_the_programs_of_the_compiling_pass(timing_script):
    output = timing_script("step_cost.py")
    said = re.fullmatch(r"\{'BLOCKTABLE_KV_WORLDS': '0'\}: (\d+) checked steps a pass; compiling pass [\d.]+ s, "
                        r"timed pass [\d.]+ s = [\d.]+ checked steps/s \([\d.]+ ms a step\)\n", output)
    assert said and int(said.group(1)) > 0, output
