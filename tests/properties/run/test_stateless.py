"""How big the stateless mode's slot-mapping batches are drawn: --max-tokens when
given; else 4096 under the interpreter, and on a GPU 2**24 tokens or as many as let
every worker sharing the GPU hold its largest batch at once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from blocktable.cli.fuzz_workers import sharing_devices
from blocktable.properties.run.messages import Job
from blocktable.properties.run.stateless import (
    INTERPRETED_CAP,
    LARGEST_CAP,
    SMALLEST_CAP,
    WORST_BYTES_PER_CAP_TOKEN,
    batch_cap,
    stateless_cap,
)
from blocktable.properties.run.workers import placements

GIB = 1 << 30


@pytest.mark.parametrize("total, sharers, cap", [
    (80 * GIB, 1, 1 << 24),  # an H100 to itself: 2**24 fits many times over
    (141 * GIB, 1, 1 << 24),
    (80 * GIB, 14, 80 * GIB // (14 * 1600)),  # --jobs 14 on one H100: 3,834,792
    (141 * GIB, 14, 141 * GIB // (14 * 1600)),
    (4 * GIB, 64, 1 << 16),  # never below 65,536 tokens
    (80 * GIB, 0, 1 << 24),  # no sharer counted: the process itself
])
def test_the_cap_fits_every_sharers_largest_batch_in_the_gpu(total, sharers, cap):
    assert WORST_BYTES_PER_CAP_TOKEN == 1600
    assert batch_cap(total, sharers) == cap
    assert SMALLEST_CAP <= cap <= LARGEST_CAP
    if cap > SMALLEST_CAP:
        assert max(1, sharers) * cap * WORST_BYTES_PER_CAP_TOKEN <= total


def test_the_cap_given_wins_and_the_interpreter_keeps_its_small_calls():
    interpreted = SimpleNamespace(interpreted=True)
    assert stateless_cap(Job("triton"), interpreted) == INTERPRETED_CAP == 4096
    assert stateless_cap(Job("triton", max_tokens=77), interpreted) == 77
    assert stateless_cap(Job("triton", max_tokens=1 << 30, device_sharers=14), SimpleNamespace(interpreted=False)) \
        == 1 << 30  # given: not sized to the device, nor asked about it


def test_workers_are_told_how_many_share_their_gpu():
    jobs = [Job("triton", seed=i) for i in range(5)]
    assert [j.device_sharers for j in sharing_devices(jobs, placements(5, [], cores=[0]))] == [5] * 5
    assert [j.device_sharers for j in sharing_devices(jobs, placements(5, ["0", "1"], cores=[0]))] == [3, 2, 3, 2, 3]
    assert [j.seed for j in sharing_devices(jobs, placements(5, [], cores=[0]))] == list(range(5))  # nothing else
