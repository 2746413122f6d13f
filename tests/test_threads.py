"""The suite's own set-up (tests/conftest.py): under `pytest -n auto` every worker and
every process it starts run their numeric libraries on one thread."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from blocktable.properties.run.workers import THREAD_VARIABLES

CHILD = "import os, torch; print(' '.join(os.environ.get(n, '-') for n in {names!r}), torch.get_num_threads())"


@pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER"), reason="only xdist workers pin their threads")
def test_an_xdist_worker_and_the_processes_it_starts_run_one_thread_each():
    if os.environ.get("OMP_NUM_THREADS", "1") != "1":
        pytest.skip("the user set OMP_NUM_THREADS, which the suite keeps")
    assert torch.get_num_threads() == 1
    done = subprocess.run([sys.executable, "-c", CHILD.format(names=list(THREAD_VARIABLES))], capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.split() == ["1"] * len(THREAD_VARIABLES) + ["1"]
