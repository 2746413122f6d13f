"""`ci/bars.py`: issue 28's bars read from the outputs `ci/throughput.sh` collects. The
summaries it reads are real `blocktable fuzz` output (a short CPU run of each mode),
so a change to the summary's wording shows here rather than as a bar silently "not
measured" on a GPU host."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CI = Path(__file__).resolve().parents[2] / "ci"


def bars(folder: Path) -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, str(CI / "bars.py"), str(folder)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line.strip("|").split(" | ") for line in done.stdout.splitlines()[2:]]
    return {row[0].strip(): [cell.strip() for cell in row[1:]] for row in rows}


def fuzz(folder: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKTABLE_")} | {"BLOCKTABLE_KV_WORLDS": "0"}
    done = subprocess.run([sys.executable, "-m", "blocktable.cli.main", "fuzz", "--device", "cpu", "--out",
                           str(folder), *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def summaries(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A passing lockstep run's summary and a passing stateless run's."""
    work = tmp_path_factory.mktemp("runs")
    return fuzz(work / "lockstep", "--examples", "2"), fuzz(work / "stateless", "--stateless", "--examples", "3")


def test_each_bar_is_read_from_its_run_and_judged(tmp_path, summaries):
    lockstep, stateless = summaries
    rate = float(re.search(r"checked steps\s*│\s*\d+ \(([\d.]+)/s\)", lockstep).group(1))
    (tmp_path / "kv-pair.txt").write_text("checked steps/s: first run A 200.0, B 180.0; swapped A 210.0, B 150.0\n"
                                          "results: first run A pass, B pass; swapped A pass, B pass\n"
                                          "B / A, geometric mean: 0.803\n")
    (tmp_path / "scaling").mkdir()
    (tmp_path / "scaling" / "jobs-1.txt").write_text(lockstep)
    (tmp_path / "scaling" / "jobs-14.txt").write_text(lockstep)  # the same rate: 1/14 of linear
    (tmp_path / "stateless.txt").write_text(stateless)
    (tmp_path / "stateless-kv-copy.txt").write_text(stateless)
    got = bars(tmp_path)
    ratio = ((180 / 200) * (150 / 210)) ** 0.5  # 0.802: the pair's geometric mean, >= 0.80
    assert got["KV worlds' cost (side by side, B: KV worlds on)"][1:] == [
        f"200.0 / 180.0, swapped 210.0 / 150.0: {ratio:.3f}", "met"]
    assert got["one process, default mix (`fuzz --jobs 1`)"][1:] == [f"{rate:.1f}", "**not met**"]  # the interpreter's rate
    assert got["--jobs 14"][1:] == [f"{rate:,.1f}", "**not met**"]
    assert got["--jobs 14 against one worker"][2] == "**not met**"
    assert got["--jobs 14 against one worker"][1].startswith("7% (")
    assert got["stateless slot mapping"][2] == "**not met**"
    assert got["stateless slot mapping"][1].endswith("M tokens/s")
    assert got["stateless --kv-copy"][1].endswith(" tokens/s")
    assert got["stateless --kv-write"][1] == "no passing run"


def test_a_missing_or_failing_run_is_not_measured_never_met(tmp_path, summaries):
    lockstep, _ = summaries
    failed = re.sub(r"(│ result\s*│\s*)pass", r"\1discrepancy", lockstep)
    assert failed != lockstep
    (tmp_path / "scaling").mkdir()
    (tmp_path / "scaling" / "jobs-1.txt").write_text(failed)  # a run with a finding: its rate is no bar's figure
    (tmp_path / "kv-pair.txt").write_text("checked steps/s: first run A 200.0, B 180.0; swapped A 210.0, B 150.0\n"
                                          "results: first run A pass, B fail; swapped A pass, B pass\n")
    got = bars(tmp_path)
    assert {name: row[2] for name, row in got.items() if not name.startswith("stateless --")} == {
        "KV worlds' cost (side by side, B: KV worlds on)": "not measured",
        "one process, default mix (`fuzz --jobs 1`)": "not measured",
        "--jobs 14": "not measured", "--jobs 14 against one worker": "not measured",
        "stateless slot mapping": "not measured"}
