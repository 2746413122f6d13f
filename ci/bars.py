"""Issue 28's throughput bars read from the outputs `ci/throughput.sh` leaves in one
folder, printed as a Markdown table: each bar, the figure measured and whether it is
met. A measurement whose output holds no figure (its run failed, or was cut short)
is "not measured", never met.

    python ci/bars.py throughput-results
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

# The figures as `blocktable fuzz` and ci/side_by_side.sh print them.
CHECKED_STEPS = re.compile(r"^│ checked steps\s*│\s*[\d,]+ \(([\d.]+)/s\)", re.MULTILINE)
TOKENS_PER_S = re.compile(r"^│ tokens/s\s*│\s*([\d,]+)", re.MULTILINE)
RESULT = re.compile(r"^│ result\s*│\s*(\S+)", re.MULTILINE)
PAIR = re.compile(r"checked steps/s: first run A ([\d.]+), B ([\d.]+); swapped A ([\d.]+), B ([\d.]+)")
PAIR_RESULTS = re.compile(r"results: first run A (\w*), B (\w*); swapped A (\w*), B (\w*)")

KV_PAIR_BAR = 0.80
ONE_PROCESS_BAR = 300.0
HOST_BAR = 3000.0
SHARE_BAR = 0.70
HOST_JOBS = 14
STATELESS_BAR = 1e9


@dataclass(frozen=True)
class Bar:
    name: str
    wanted: str
    figure: str
    met: bool | None  # None: not measured

    def row(self) -> str:
        verdict = {True: "met", False: "**not met**", None: "not measured"}[self.met]
        return f"| {self.name} | {self.wanted} | {self.figure} | {verdict} |"


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def passing_rate(text: str, pattern: re.Pattern[str]) -> float | None:
    """The rate a `blocktable fuzz` summary reports, if its run passed."""
    rate, result = pattern.search(text), RESULT.search(text)
    if rate is None or result is None or result.group(1) != "pass":
        return None
    return float(rate.group(1).replace(",", ""))


def kv_pair(text: str) -> Bar:
    match, results = PAIR.search(text), PAIR_RESULTS.search(text)
    name = "KV worlds' cost (side by side, B: KV worlds on)"
    if match is None or results is None or set(results.groups()) != {"pass"}:
        return Bar(name, f"B / A >= {KV_PAIR_BAR}", "no pair of passing runs", None)
    a1, b1, a2, b2 = (float(x) for x in match.groups())
    ratio = math.sqrt((b1 / a1) * (b2 / a2))
    return Bar(name, f"B / A >= {KV_PAIR_BAR}", f"{a1} / {b1}, swapped {a2} / {b2}: {ratio:.3f}",
               ratio >= KV_PAIR_BAR)


def one_process(text: str) -> Bar:
    rate = passing_rate(text, CHECKED_STEPS)
    name = "one process, default mix (`fuzz --jobs 1`)"
    if rate is None:
        return Bar(name, f">= {ONE_PROCESS_BAR:.0f} checked steps/s", "no passing run", None)
    return Bar(name, f">= {ONE_PROCESS_BAR:.0f} checked steps/s", f"{rate:.1f}", rate >= ONE_PROCESS_BAR)


def host(one: str, many: str) -> list[Bar]:
    alone, together = passing_rate(one, CHECKED_STEPS), passing_rate(many, CHECKED_STEPS)
    total = Bar(f"--jobs {HOST_JOBS}", f">= {HOST_BAR:,.0f} checked steps/s",
                "no passing run" if together is None else f"{together:,.1f}",
                None if together is None else together >= HOST_BAR)
    if alone is None or together is None:
        return [total, Bar(f"--jobs {HOST_JOBS} against one worker", f">= {SHARE_BAR:.0%}", "not both runs", None)]
    share = together / (HOST_JOBS * alone)
    return [total, Bar(f"--jobs {HOST_JOBS} against one worker", f">= {SHARE_BAR:.0%} of {HOST_JOBS} x one",
                       f"{share:.0%} ({together:,.1f} / ({HOST_JOBS} x {alone:.1f}))", share >= SHARE_BAR)]


def stateless(text: str) -> Bar:
    rate = passing_rate(text, TOKENS_PER_S)
    name = "stateless slot mapping"
    if rate is None:
        return Bar(name, ">= 1G tokens/s", "no passing run", None)
    return Bar(name, ">= 1G tokens/s", f"{rate / 1e6:,.1f}M tokens/s", rate >= STATELESS_BAR)


def main(folder: Path) -> str:
    one = _read(folder / "scaling" / "jobs-1.txt")
    bars = [kv_pair(_read(folder / "kv-pair.txt")), one_process(one),
            *host(one, _read(folder / "scaling" / f"jobs-{HOST_JOBS}.txt")),
            stateless(_read(folder / "stateless.txt"))]
    lines = ["| bar | wanted | measured | verdict |", "| --- | --- | --- | --- |", *(b.row() for b in bars)]
    for kind in ("write", "copy", "gather"):
        rate = passing_rate(_read(folder / f"stateless-kv-{kind}.txt"), TOKENS_PER_S)
        lines.append(f"| stateless --kv-{kind} | reported | "
                     f"{'no passing run' if rate is None else f'{rate:,.0f} tokens/s'} | - |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
