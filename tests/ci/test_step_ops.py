"""`ci/step_ops.py`: a checked step's torch operations, Triton launches and (on a GPU)
waits, counted by our call site. What it promises: the counted pass ran the
programs of the first, the counts are per checked step, each named by a line of our
code that exists, and what torch-native kernels do inside is counted apart."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.fuzz
def test_a_step_is_counted_by_our_call_sites(timing_script):
    output = timing_script("step_ops.py", "--top", "8")
    head = re.match(r"\{'BLOCKTABLE_KV_WORLDS': '0'\}, slot kernel triton, cpu: (\d+) checked steps counted; "
                    r"per checked step ([\d.]+) torch operations dispatched by our code \(([\d.]+) more inside "
                    r"torch-native kernels, .*\), ([\d.]+) Triton launches, waits for the device not counted", output)
    assert head, output
    steps, ours, inside, launches = int(head.group(1)), *(float(head.group(i)) for i in (2, 3, 4))
    assert steps > 0 and ours > 0 and inside > 0 and launches > 0, output
    ops = output.split("torch operations per checked step, by call site:\n")[1].split("Triton launches")[0]
    rows = re.findall(r"^ +([\d.]+)  ([\w/]+\.py):(\d+) (\w+)  \[(.+)\]$", ops, flags=re.MULTILINE)
    assert 0 < len(rows) <= 8, ops
    for _, path, line, _, _ in rows:  # each a real line of one of our four packages
        assert path.split("/")[0] in ("blocktable", "kernels", "properties", "reference"), path
        assert int(line) <= len((ROOT / path).read_text().splitlines()), (path, line)
        assert not path.endswith(("kv_torch.py", "v2_torch.py")), path  # counted apart, as kernels
    assert [float(n) for n, *_ in rows] == sorted((float(n) for n, *_ in rows), reverse=True)
    # The slot-mapping kernel is launched from our wrapper, blocktable/slot.py.
    launched = output.split("Triton launches per checked step, by call site:\n")[1]
    assert re.search(r"^ +[\d.]+  blocktable/slot\.py:\d+ \w+  \[slot_mapping\w* [\d.]+", launched,
                     flags=re.MULTILINE), launched


WAITS = '''
import sys, warnings
import torch
sys.path.insert(0, sys.argv[1])
import step_ops

# No GPU here: the sync debug mode only records what it is set to, and an event's
# own wait that it ran.
modes = []
torch.cuda.get_sync_debug_mode = lambda: 0
torch.cuda.set_sync_debug_mode = modes.append
ran = []
torch.cuda.Event.synchronize = event = lambda self: ran.append("event")
shown = []
warnings.showwarning = show = lambda message, *rest, **kwargs: shown.append(str(message))
sites, waits = step_ops.Sites(), step_ops.Counts()
with step_ops.counting_waits(sites, waits):
    assert modes == ["warn"]
    for _ in range(2):  # each time, not once a line
        warnings.warn("called a synchronizing CUDA operation")
    warnings.warn("a warning of something else")
    torch.cuda.Event.synchronize(object())
print(sorted(waits.by.items()), shown, ran, modes, torch.cuda.Event.synchronize is event, warnings.showwarning is show)
'''


def test_waits_are_counted_and_other_warnings_still_shown():
    """On a GPU the waits come from torch's sync debug mode (a warning each) and from
    explicit event waits; here both are stood in for, to check what is counted, that
    another warning still reaches the screen and that everything is put back."""
    done = subprocess.run([sys.executable, "-c", WAITS, str(ROOT / "ci")], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("[(('outside our code', 'Event.synchronize'), 1), "
                                   "(('outside our code', 'implicit (sync debug mode)'), 2)] "
                                   "['a warning of something else'] ['event'] ['warn', 0] True True")
