"""Stateful lockstep fuzzing: random add/step/fork/finish/preempt/resume/move/swap/
condense/reject programs through the reference and the implementation together,
everything compared after every step (properties/lockstep.py lists what)."""

import time

import pytest
from hypothesis.stateful import run_state_machine_as_test

from blocktable.properties.lockstep.machine import make_machine
from blocktable.properties.run import profiles
from blocktable.properties.run.prepare import plugins_for

pytestmark = pytest.mark.fuzz


def run_machine(backend, kernel_name, record_property, **overrides):
    runs = []
    machine = make_machine(plugins_for(kernel_name, {}, backend), backend, on_run=runs.append)
    start = time.perf_counter()
    run_state_machine_as_test(machine, settings=profiles.machine_settings(**overrides))
    elapsed = time.perf_counter() - start
    steps = sum(r.steps_checked for r in runs)
    busy = sum(r.steps_with_tokens for r in runs)
    ops = sum(len(r.program) for r in runs)
    record_property("lockstep", f"{kernel_name} on {backend.name}: {len(runs)} runs, {ops} operations, "
                                f"{steps} checked steps ({busy} scheduling tokens) in {elapsed:.1f} s = "
                                f"{steps / elapsed:.1f} steps/s")
    return runs


def test_our_tiled_kernel_in_lockstep(backend, record_property):
    run_machine(backend, "triton-tiled", record_property)


def test_our_per_request_kernel_in_lockstep(backend, record_property):
    run_machine(backend, "triton-per-request", record_property, max_examples=40)


def test_the_reference_against_itself(backend, record_property):
    """The harness end to end with the model as the kernel: must never fail."""
    run_machine(backend, "reference", record_property, max_examples=20)


def test_our_specialized_kernel_in_lockstep(backend, record_property):
    """Compiled per configuration on a GPU, so fewer examples there."""
    run_machine(backend, "triton-specialized", record_property, max_examples=20)
