"""The report's verdict lines (properties/report/report.py) follow the replays: a
failure that fails again in the process that found it and passes alone in a fresh
one is named as state kept from earlier calls, also where the whole run passes in a
fresh process (a table kept by data_ptr sees other addresses there)."""

from blocktable.properties.cases.confirmation import Confirmation
from blocktable.properties.report.report import Report, confirmation_lines


def report(whole_run_reproduced, repeated_in_process, whole_run="30 contract examples, then 7 programs (378 steps)"):
    return Report("blocktable found a discrepancy", "k.py:slot_mapping", "cpu", "config", None, None,
                  case="cases/case.json", confirmation=Confirmation(False, whole_run_reproduced, "note"),
                  whole_run=whole_run, repeated_in_process=repeated_in_process)


STATE = ("  it fails again in the process that found it, replayed there after its earlier calls: the kernel keeps "
         "state from earlier calls (a cache keyed on the wrong inputs, a table kept by data_ptr) and this failure "
         "depends on it.")
REPEAT = "  blocktable replay cases/case.json --repeat 20 counts how often it fails in fresh processes."


def test_state_shown_in_the_finding_process_though_the_whole_run_passes_fresh():
    assert confirmation_lines(report(False, True)) == [
        "  not confirmed: replayed alone in a fresh process, it passes.", STATE,
        "  the whole run that found it (30 contract examples, then 7 programs (378 steps)) passes in a fresh "
        "process: the state did not build up the same way there (a table kept by data_ptr sees other addresses "
        "in another process). The case file keeps the whole run.", REPEAT]


def test_state_shown_in_the_finding_process_of_a_single_call():
    assert confirmation_lines(report(None, True, whole_run=None)) == [
        "  not confirmed: replayed alone in a fresh process, it passes.", STATE, REPEAT]


def test_a_failure_that_repeated_nowhere_is_nondeterministic():
    assert confirmation_lines(report(None, False, whole_run=None)) == [
        "  not confirmed: replayed alone in a fresh process, it passes.",
        "  nor did it fail when the process that found it replayed it after its earlier calls: the failure above "
        "is the one first seen.",
        "  the failure is nondeterministic (a race, memory never initialised) or depends on something outside the "
        "case.", REPEAT]
