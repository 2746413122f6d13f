"""run/warm.py: the warm calls shared among spawned processes, each reported once;
processes that cannot start their share are said to have died; the background
processes end with the body. Under the interpreter the calls compile nothing, but
they run the same code a GPU host runs."""

import time

import pytest
import torch

from blocktable.properties.lockstep.warm import warm_calls
from blocktable.properties.run.warm import family_calls, in_background, warm


def test_every_call_is_made_once_by_one_of_the_processes():
    seen = []
    report = warm("cpu", 2, lambda what, error: seen.append((what, error)))
    assert report.total == len(warm_calls()) == 1 + 12 + 12 + 2 + 90  # the examples, slot mapping, oracle, V2, KV worlds
    assert report.done == report.total and report.failed == [] and report.died == []
    assert sorted(what for what, _ in seen) == sorted(call.describe() for call in warm_calls())
    assert all(error is None for _, error in seen)


def test_the_stateless_kv_family_is_warmed_the_same_way():
    from blocktable.properties.kv.warm import calls

    seen = []
    report = warm("cpu", 2, lambda what, error: seen.append((what, error)), "stateless-kv")
    assert report.total == len(calls()) == 48 and report.done == 48 and report.failed == []
    assert sorted(what for what, _ in seen) == sorted(call.describe() for call in calls())


def test_an_unknown_family_is_refused():
    with pytest.raises(ValueError, match="no warm family 'slots'"):
        family_calls("slots")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without a GPU: cuda must fail to start")
def test_processes_that_cannot_start_are_said_to_have_died():
    seen = []
    report = warm("cuda", 2, lambda what, error: seen.append(what))
    assert report.done == 0 and seen == []
    assert len(report.died) == 2 and all(code not in (0, None) for code in report.died)


def test_the_background_processes_end_with_the_body():
    with in_background("cpu", 2, None) as processes:
        assert len(processes) == 2
        time.sleep(0.5)
    assert not any(process.is_alive() for process in processes)
