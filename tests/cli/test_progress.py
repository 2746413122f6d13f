"""Progress in a log: with stdout a pipe, `blocktable fuzz` prints a plain line every
few seconds (programs, steps, rate, elapsed) and no live display; on a terminal,
rich's live bars. The interval is the environment's, checked before any work."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

from blocktable.cli.main import main
from blocktable.cli.progress import SECONDS_VARIABLE, LiveBars, PlainLines, bars, clock_text, interval

LINE = re.compile(r"^fuzz reference: (\d+) programs \(\d+\.\d/s\), (\d+) checked steps, \d+ kinds of event reached; "
                  r"(\d:\d\d:\d\d) elapsed$")


@pytest.mark.fuzz
def test_fuzz_with_stdout_to_a_pipe_prints_progress_lines(tmp_path):
    command = [sys.executable, "-m", "blocktable.cli.main", "fuzz", "--kernel", "reference", "--device", "cpu",
               "--examples", "12", "--out", "cases"]
    run = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env={**os.environ, SECONDS_VARIABLE: "0.000001"})  # a line per update: no race with speed
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [m for line in run.stdout.splitlines() if (m := LINE.match(line))]
    assert len(lines) >= 2, run.stdout
    programs = [int(m[1]) for m in lines]
    assert programs == sorted(programs) and programs[-1] > programs[0], programs
    assert "\r" not in run.stdout and "\x1b[" not in run.stdout  # no live display redrawn in place
    assert "no discrepancy found" in run.stdout


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_plain_line_when_first_updated_then_at_most_one_per_interval():
    printed: list[str] = []
    clock = Clock()
    lines = PlainLines(printed.append, every=30, clock=clock)
    total, worker = lines.add("fuzz x", 100), lines.add("worker 1", 50, logged=False)
    lines.update(total, 1, "1 program")
    lines.update(worker, 1, "1 program")
    clock.now += 29.9
    lines.update(total, 5, "5 programs")
    clock.now += 0.1
    lines.update(total, 6, "6 programs")
    clock.now += 3600
    lines.update(total, 90, "90 programs")
    assert printed == ["fuzz x: 1 program; 0:00:00 elapsed", "fuzz x: 6 programs; 0:00:30 elapsed",
                       "fuzz x: 90 programs; 1:00:30 elapsed"]


def test_live_bars_on_a_terminal_plain_lines_in_a_log():
    assert isinstance(bars(Console(file=io.StringIO(), force_terminal=False)), PlainLines)
    live = bars(Console(file=io.StringIO(), force_terminal=True))
    assert isinstance(live, LiveBars)
    live.stop()
    assert clock_text(3725.9) == "1:02:05"


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf", "nan"])
def test_a_bad_interval_is_a_usage_error_before_any_work(monkeypatch, capsys, tmp_path, value):
    monkeypatch.setenv(SECONDS_VARIABLE, value)
    with pytest.raises(ValueError, match=SECONDS_VARIABLE):
        interval()
    monkeypatch.chdir(tmp_path)
    assert main(["fuzz", "--kernel", "reference", "--device", "cpu", "--examples", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and SECONDS_VARIABLE in captured.err
    assert list(tmp_path.iterdir()) == []


def test_the_interval_defaults_to_thirty_seconds(monkeypatch):
    monkeypatch.delenv(SECONDS_VARIABLE, raising=False)
    assert interval() == 30.0
    monkeypatch.setenv(SECONDS_VARIABLE, "2.5")
    assert interval() == 2.5


def test_mutants_in_a_log_print_a_line_at_the_start_and_one_per_verdict(monkeypatch, capsys):
    """With stdout not a terminal, the mutation gate prints plain lines, not rich's
    live bar: one when it starts and one per verdict (in the order the mutants were
    given, with one job), then its table. The mutants' fuzzing is replaced by a
    verdict at once: what is checked is how the gate shows them."""
    from blocktable.properties.mutation import run as mutation_run
    from blocktable.properties.mutation.catalogue import CATALOGUE

    first, second = [m for m in CATALOGUE if not m.equivalent][:2]

    def verdict(mutant, budget, seed, device, place):
        killed = mutant is first
        return mutation_run.Verdict(mutant.id, mutant.layer, mutant.imitates, killed,
                                    seconds_to_kill=1.5 if killed else None, examples_to_kill=3 if killed else None)

    monkeypatch.setattr(mutation_run, "run_mutant", verdict)
    monkeypatch.setenv(SECONDS_VARIABLE, "3600")  # no line but the start's and the verdicts'
    code = main(["mutants", "--only", first.id, second.id, "--jobs", "1", "--device", "cpu"])
    out = capsys.readouterr().out
    assert code == 1, out  # the second survived
    progress, table = out.split("blocktable mutation gate\n")
    lines = [re.sub(r"; \d:\d\d:\d\d elapsed$", "; ELAPSED", line) for line in progress.splitlines()]
    assert lines == ["mutants: 0/2 run, 0 killed; ELAPSED",  # all that comes before the table: no bar
                     f"mutants: 1/2 run, 1 killed; {first.id} killed in 1.5 s; ELAPSED",
                     f"mutants: 2/2 run, 1 killed; {second.id} SURVIVED; ELAPSED"]
    assert "\r" not in out and "\x1b[" not in out
    assert table.splitlines()[-1] == "1/2 non-equivalent mutants killed; time to kill: median 1.5 s, worst 1.5 s"



def test_mutants_beside_json_show_progress_on_stderr_and_keep_stdout_json(monkeypatch, capsys):
    """`mutants --json > FILE` (the nightly's) owns stdout for the verdicts alone; its
    progress lines go to stderr, so that a log shows each verdict as it comes, also
    when a time limit stops the gate before the JSON is printed."""
    from blocktable.properties.mutation import run as mutation_run
    from blocktable.properties.mutation.catalogue import CATALOGUE

    first = next(m for m in CATALOGUE if not m.equivalent)

    def verdict(mutant, budget, seed, device, place):
        return mutation_run.Verdict(mutant.id, mutant.layer, mutant.imitates, True, seconds_to_kill=2.0,
                                    examples_to_kill=1)

    monkeypatch.setattr(mutation_run, "run_mutant", verdict)
    monkeypatch.setenv(SECONDS_VARIABLE, "3600")
    for form in ("--json", "--markdown"):
        assert main(["mutants", "--only", first.id, "--jobs", "1", "--device", "cpu", form]) == 0
        captured = capsys.readouterr()
        lines = [re.sub(r"; \d:\d\d:\d\d elapsed$", "; ELAPSED", line) for line in captured.err.splitlines()]
        assert lines == ["mutants: 0/1 run, 0 killed; ELAPSED",
                         f"mutants: 1/1 run, 1 killed; {first.id} killed in 2.0 s; ELAPSED"], form
        if form == "--json":
            assert [v["id"] for v in json.loads(captured.out)] == [first.id]
        else:
            assert captured.out.startswith("| mutant |") and "mutants:" not in captured.out
