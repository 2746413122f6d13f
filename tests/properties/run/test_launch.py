"""A child started from the fork server (properties/run/launch.py) lives in its
parent's environment and SIGINT disposition of the moment it starts, not in those
the server was started with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from blocktable.properties.run.child import run_in_child
from blocktable.properties.run.messages import Job

TARGETS = Path(__file__).parent / "targets"


@pytest.fixture
def probe(monkeypatch):
    """probe() -> what a fresh child saw (launch_probe.report)."""
    monkeypatch.syspath_prepend(str(TARGETS))
    import launch_probe

    def run() -> dict[str, str | None]:
        outcome = run_in_child(launch_probe.report, Job("unused"))
        assert outcome.exitcode == 0 and outcome.result is not None, outcome
        return json.loads(outcome.result.message)

    return run


def test_each_child_takes_the_environment_its_parent_has_when_it_starts(probe, monkeypatch):
    monkeypatch.setenv("BLOCKTABLE_LAUNCH_PROBE", "first")
    first = probe()  # the server is running after this, if it was not before
    monkeypatch.setenv("BLOCKTABLE_LAUNCH_PROBE", "second")
    second = probe()
    monkeypatch.delenv("BLOCKTABLE_LAUNCH_PROBE")
    third = probe()
    assert (first["now"], second["now"], third["now"]) == ("first", "second", None)


def test_a_childs_target_is_imported_in_the_parents_environment_of_the_moment(probe, monkeypatch):
    # A module that reads a setting when it is imported (as a kernel module reads
    # TRITON_INTERPRET) sees the parent's current environment, in every child.
    monkeypatch.setenv("BLOCKTABLE_LAUNCH_PROBE", "first")
    first = probe()
    monkeypatch.setenv("BLOCKTABLE_LAUNCH_PROBE", "second")
    second = probe()
    assert (first["at_import"], second["at_import"]) == ("first", "second")


@pytest.fixture(params=["Python's own handler", "ignored"])
def parent_sigint(request):
    """The SIGINT disposition this process has when the test starts its children, set
    for the test and put back after: a suite started in the background by a shell
    without job control (`pytest -n auto &`, as some CI scripts do) runs its workers
    with SIGINT ignored from the start, and a child started from a thread takes
    whatever the parent has."""
    handler = signal.default_int_handler if request.param == "Python's own handler" else signal.SIG_IGN
    previous = signal.signal(signal.SIGINT, handler)
    yield "KeyboardInterrupt" if handler is signal.default_int_handler else "ignored"
    signal.signal(signal.SIGINT, previous)


def test_a_child_ignores_sigint_exactly_when_its_parent_starts_it_from_the_main_thread(probe, parent_sigint):
    # run_in_child starts children inside sigint_ignored(), which only the main thread
    # can enter; from another thread (the mutation gate's pool) a child starts with the
    # parent's own disposition, as a spawned one did, whatever the server started with.
    def from_a_thread() -> dict[str, str | None]:
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(probe).result()

    seen = [probe()["sigint"], from_a_thread()["sigint"], probe()["sigint"], from_a_thread()["sigint"]]
    assert seen == ["ignored", parent_sigint, "ignored", parent_sigint]
    assert signal.getsignal(signal.SIGINT) is (signal.SIG_IGN if parent_sigint == "ignored"
                                               else signal.default_int_handler)


def test_a_child_that_chooses_the_interpreter_after_its_server_started_without_it_runs_tritons_helpers(tmp_path):
    # A GPU host's run with --device cpu: the parent (and so the fork server) starts
    # without TRITON_INTERPRET, the child sets it. Triton's own @triton.jit helpers
    # (tl.cdiv, ...) must then be made in the child, interpreted; made in the server,
    # every contract example fails with "Cannot call @triton.jit'd outside of the
    # scope of a kernel". A fresh process, so that its fork server is its own.
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "blocktable.cli.main", "fuzz", "--kernel", "triton",
                           "--device", "cpu", "--examples", "1", "--out", str(tmp_path / "cases")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
