"""A case carries where it was found (the device that replays it, the backend in
words, the versions). `replay` without --device replays there; on another device it
says so before anything runs, since a pass there says nothing about the device
that found it."""

from __future__ import annotations

import pytest
import torch

from blocktable.cli.replay import replay_device
from blocktable.properties.cases.case import Case
from blocktable.properties.world import WorldConfig

H200 = "NVIDIA H200 (sm_90, triton 3.9.0, torch 2.13.0)"


def case_found_on(device: str | None) -> Case:
    where = {} if device is None else {"replay_device": device, "backend": H200 if device == "cuda" else "cpu"}
    return Case("lockstep", "reference", {"what": "planted", "message": "planted", "step": None},
                world=WorldConfig(), program=[{"op": "add"}], provenance={"python": "3.11", **where})


@pytest.mark.parametrize("found, asked, gpu, runs, says", [
    ("cuda", None, False, "cpu", "was found on cuda (NVIDIA H200"),
    ("cuda", None, True, "cuda", None),
    ("cpu", None, True, "cpu", None),
    ("cuda", "cpu", True, "cpu", "it replays on cpu as asked: a pass here does not show it passes on cuda"),
    ("cpu", "auto", True, "auto", "was found on cpu (cpu); it replays on cuda as asked"),
    ("cpu", "auto", False, "auto", None),
    (None, None, True, "auto", None),  # an older case: as before
])
def test_replay_runs_where_the_case_was_found_or_says_it_does_not(found, asked, gpu, runs, says):
    device, note = replay_device(case_found_on(found), asked, gpu)
    assert device == runs
    assert (note is None) if says is None else (note is not None and says in note), note


@pytest.mark.fuzz
def test_a_case_found_on_a_gpu_replays_on_the_interpreter_here_and_says_so_first(cli, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the case would replay there")
    path = case_found_on("cuda").save(tmp_path / "cases")
    code, out = cli("replay", str(path))
    lines = out.splitlines()
    assert code == 0, out
    assert lines[0].startswith(f"note: this case was found on cuda ({H200}); this machine has no GPU, so it "
                               "replays on cpu"), out
    assert "passes now with reference on Triton interpreter on the CPU" in out
