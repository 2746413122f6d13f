"""What the tests of the lockstep's timing scripts (`ci/step_cost.py`,
`ci/compile_cost.py`) share: running one as a user would, on a few programs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

CI = Path(__file__).resolve().parents[2] / "ci"


@pytest.fixture
def timing_script(tmp_path: Path) -> Callable[..., str]:
    """Runs `ci/NAME --examples 3 --device cpu` with KV worlds off and no other
    BLOCKTABLE_ setting (a budget of programs, not seconds: a loaded machine may not
    finish one program in a few seconds); returns its output, once it exited 0."""
    def run(name: str, *extra: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKTABLE_")} | {"BLOCKTABLE_KV_WORLDS": "0"}
        done = subprocess.run([sys.executable, str(CI / name), "--examples", "3", "--device", "cpu", *extra],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
        assert done.returncode == 0, done.stderr
        return done.stdout
    return run
