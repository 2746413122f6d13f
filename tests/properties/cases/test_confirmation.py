"""What the replays of a failure say about the kernel (properties/cases/confirmation.py):
a failure that passes alone in a fresh process but fails after earlier calls, in the
whole run replayed fresh or in the process that found it, is state kept from call to
call; one that failed once and then passed wherever it was replayed is chance."""

import pytest

from blocktable.properties.cases.confirmation import Confirmation, verdict

# (case alone in a fresh process, the whole run in a fresh process, the finding process's replay) -> verdict
VERDICTS = [
    ((True, None, None), "confirmed"),
    ((True, None, False), "confirmed"),
    ((False, True, None), "state"),
    ((False, True, False), "state"),
    # A table kept by data_ptr: the whole run sees other addresses in a fresh process
    # and passes, while the process that found it fails again.
    ((False, False, True), "state"),
    ((False, None, True), "state"),  # a stateless call: no whole run is kept
    ((False, False, False), "nondeterministic"),
    ((False, False, None), "nondeterministic"),
    ((False, None, False), "nondeterministic"),
    ((False, None, None), "unknown"),
]


@pytest.mark.parametrize("replays, said", VERDICTS, ids=[f"{r}->{s}" for r, s in VERDICTS])
def test_the_verdict_of_each_combination_of_replays(replays, said):
    assert verdict(*replays) == said


def test_a_confirmation_keeps_the_finding_process_replay_through_json():
    confirmation = Confirmation(False, None, "note", repeated_in_process=True)
    data = confirmation.to_json()
    assert data == {"reproduced": False, "whole_run_reproduced": None, "repeated_in_process": True, "note": "note"}
    assert Confirmation.from_json(data) == confirmation
    assert Confirmation.from_json({"reproduced": False, "whole_run_reproduced": False, "note": "an older file"}) == \
        Confirmation(False, False, "an older file", None)
