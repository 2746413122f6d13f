"""`ci/step_cost.py`: the same seeded programs twice in one process, the second pass
timed. What it promises is that the two passes ran the same programs (else the time
is not a step's cost), and it stops with an error where they did not."""

from __future__ import annotations

import pstats
import re

import pytest


@pytest.mark.fuzz
def test_the_timed_pass_runs_the_programs_of_the_compiling_pass(timing_script):
    output = timing_script("step_cost.py")
    said = re.fullmatch(r"\{'BLOCKTABLE_KV_WORLDS': '0'\}: (\d+) checked steps a pass; compiling pass [\d.]+ s, "
                        r"timed pass [\d.]+ s = [\d.]+ checked steps/s \([\d.]+ ms a step\); this process's "
                        r"CPU time [\d.]+ s, \d+% of the wall time \(.*\)\n", output)
    assert said and int(said.group(1)) > 0, output


@pytest.mark.fuzz
def test_a_profiled_pass_says_where_its_time_went(timing_script, tmp_path):
    saved = tmp_path / "step.prof"
    output = timing_script("step_cost.py", "--profile", "5", "--save", str(saved))
    head, _, rest = output.partition("\n")
    assert re.fullmatch(r"\{'BLOCKTABLE_KV_WORLDS': '0'\}: \d+ checked steps a pass; .*", head), output
    assert re.match(r"profiled pass: \d+ checked steps in [\d.]+ s under cProfile; own time by part:\n", rest), output
    parts = re.findall(r"^ +[\d.]+ s +[\d.]+%  (.+)$", rest, flags=re.MULTILINE)
    assert "our lockstep code (properties)" in parts and "Hypothesis" in parts, parts
    assert "Ordered by: internal time" in rest and "List reduced" in rest  # the 5 costliest functions
    whole = pstats.Stats(str(saved))  # the whole profile, for a later look at its callers
    assert any(function == "fuzz_child" for _, _, function in whole.stats)  # type: ignore[attr-defined]


@pytest.mark.fuzz
def test_the_reference_slot_kernel_times_the_harness_alone(timing_script):
    """`--kernel reference`: the numpy slot mapping in place of the interpreted kernel
    (the harness's own host work, without a GPU), said in the line."""
    output = timing_script("step_cost.py", "--kernel", "reference")
    said = re.fullmatch(r"\{'BLOCKTABLE_KV_WORLDS': '0'\}, slot kernel reference: (\d+) checked steps a pass; .*\n",
                        output)
    assert said and int(said.group(1)) > 0, output


@pytest.mark.fuzz
def test_a_sampled_pass_says_where_its_wall_time_went(timing_script):
    output = timing_script("step_cost.py", "--sample", "5")
    head, _, rest = output.partition("\n")
    assert re.fullmatch(r"\{'BLOCKTABLE_KV_WORLDS': '0'\}: \d+ checked steps a pass; .*", head), output
    said = re.match(r"sampled pass: (\d+) checked steps in [\d.]+ s, (\d+) samples standing for [\d.]+ s; wall time "
                    r"by part of the innermost Python frame:\n", rest)
    assert said and int(said.group(1)) > 0 and int(said.group(2)) > 0, output
    parts = re.findall(r"^ +[\d.]+ s +[\d.]+%  (.+)$", rest, flags=re.MULTILINE)
    assert "our lockstep code (properties)" in parts and "Hypothesis" in parts, parts
    functions = rest.split("functions by the time they were on the stack")[1].split("lines of our code")
    assert len(re.findall(r"^ +[\d.]+% +[\d.]+  \S+ \(.+:\d+\)$", functions[0], flags=re.MULTILINE)) == 5, output
    lines = re.findall(r"^ +[\d.]+% +[\d.]+  (.+):\d+ \(\S+\)$", functions[1], flags=re.MULTILINE)
    ours = ("/blocktable/", "/kernels/", "/properties/", "/reference/")  # a checkout's or an installed layout
    assert len(lines) == 5 and all(any(folder in path for folder in ours) for path in lines), output
