"""The worker pool of `blocktable fuzz --jobs N`: how many workers `auto` means,
where each is placed (one thread per library, a core of its own, the GPUs in turn),
that a worker really runs so placed, and that the first worker to fail or die ends
the others."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from blocktable.properties.run.messages import Job, Log, Result
from blocktable.properties.run.workers import (
    THREAD_VARIABLES,
    auto_jobs,
    parse_jobs,
    placements,
    run_workers,
    usable_cores,
)

TARGETS = Path(__file__).parent / "targets"


@pytest.fixture
def probe(monkeypatch):
    """The spawned workers' target (targets/worker_probe.py). It lives under tests/,
    which Hypothesis leaves out when it mixes the literals of local modules into its
    draws: a probe module written to a scratch folder and imported stayed in this
    worker's sys.modules and changed what every later seeded test in it drew."""
    monkeypatch.syspath_prepend(str(TARGETS))
    import worker_probe

    return worker_probe.probe


def test_jobs_is_a_whole_number_or_auto():
    cores = len(usable_cores())
    assert parse_jobs("3", lambda: False) == 3
    assert parse_jobs("auto", lambda: False) == cores == auto_jobs(False)
    assert parse_jobs("auto", lambda: True) == max(1, cores - 1)  # a core for the parent on a GPU host
    for bad, said in [("0", "--jobs must be >= 1, got 0"), ("-2", "--jobs must be >= 1, got -2"),
                      ("x", "--jobs must be a whole number >= 1 or auto, got 'x'"),
                      ("1.5", "got '1.5'"), ("", "got ''")]:
        with pytest.raises(ValueError, match=said):
            parse_jobs(bad, lambda: False)


def test_each_worker_gets_one_thread_per_library_and_a_core_of_its_own():
    places = placements(3, [], cores=[0, 1, 2, 3])
    assert [p.core for p in places] == [1, 2, 3]  # the first core stays with the parent and the system
    assert all(p.env[name] == "1" for p in places for name in THREAD_VARIABLES)
    assert "CUDA_VISIBLE_DEVICES" not in places[0].env
    assert [p.core for p in placements(4, [], cores=[4, 5, 6, 7])] == [4, 5, 6, 7]
    assert [p.core for p in placements(5, [], cores=[0, 1, 2, 3])] == [None] * 5  # more workers than cores


def test_workers_take_the_gpus_in_turn():
    places = placements(5, ["2", "3"], cores=list(range(16)))
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in places] == ["2", "3", "2", "3", "2"]
    assert places[1].describe() == f"core {places[1].core}, GPU 3"


def test_a_worker_runs_single_threaded_on_its_core_and_the_parent_is_left_as_it_was(probe):
    before_env, before_cores = dict(os.environ), os.sched_getaffinity(0)
    places = placements(2, [])
    seen: list[dict] = [{}, {}]
    outcomes, ended_by = run_workers(probe, [Job("reference", seed=0)] * 2, places,
                                     lambda i, m: seen.__setitem__(i, json.loads(m.text)) if isinstance(m, Log)
                                     else None)
    assert ended_by is None and [o.result.status for o in outcomes] == ["pass", "pass"]
    for place, what in zip(places, seen):
        assert what["env"] == dict.fromkeys(THREAD_VARIABLES, "1")
        assert what["threads"] == 1 and what["interop"] == 1
        if place.core is not None:
            assert what["cores"] == [place.core]
    assert dict(os.environ) == before_env and os.sched_getaffinity(0) == before_cores


def test_the_first_failure_stops_the_others(probe):
    """The sleepers (two minutes, then a pass) were not waited for: each was ended by
    a signal before it sent its result. Said by how they ended, not by a wall-clock
    bound on the run, which a busy machine could break."""
    jobs = [Job("reference", seed=3), Job("reference", seed=1), Job("reference", seed=3)]
    outcomes, ended_by = run_workers(probe, jobs, placements(3, []))
    assert ended_by == 1 and outcomes[1].result == Result("fail") and not outcomes[1].stopped
    assert [o.stopped for o in outcomes] == [True, False, True]
    assert all(o.result is None for o in (outcomes[0], outcomes[2]))
    assert all(o.exitcode in (-signal.SIGTERM, -signal.SIGKILL) for o in (outcomes[0], outcomes[2])), outcomes


def test_a_worker_that_dies_ends_the_run_with_its_exit_code(probe):
    outcomes, ended_by = run_workers(probe, [Job("reference", seed=3), Job("reference", seed=2)], placements(2, []))
    assert ended_by == 1
    assert outcomes[1].result is None and outcomes[1].exitcode == 3 and not outcomes[1].stopped
    assert outcomes[0].stopped
