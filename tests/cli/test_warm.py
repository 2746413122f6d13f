"""`blocktable warm` and fuzz's background warm: nothing to compile under the
interpreter, a clear usage error for a bad count, and the background started only
where it helps (a lockstep run on a GPU, which launches our data oracle's kernels
whatever it plugs in, unless a warm before left its record)."""

from contextlib import nullcontext

import pytest
import torch

from blocktable.cli import warm
from blocktable.cli.main import build_parser
from blocktable.properties.lockstep.strategies import KV_WORLDS_VARIABLE
from blocktable.properties.run import warmed
from blocktable.properties.run.prepare import KV_KERNELS_VARIABLE


def test_under_the_interpreter_there_is_nothing_to_compile(cli):
    code, out = cli("warm", "--device", "cpu")
    assert code == 0
    assert "nothing to compile" in out


def test_a_bad_process_count_is_a_usage_error(cli):
    code, out = cli("warm", "--processes", "0")
    assert code == 2
    assert "--processes must be >= 1, got 0" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without a GPU")
def test_cuda_without_a_gpu_is_a_usage_error(cli):
    code, out = cli("warm", "--device", "cuda")
    assert code == 2
    assert "torch sees no CUDA GPU" in out


def fuzz_args(*extra):
    return build_parser().parse_args(["fuzz", "--device", "cuda", *extra])


@pytest.mark.parametrize("extra, environment", [
    ((), {}),
    (("--kv-write", "torch", "--kv-copy", "torch", "--kv-gather", "torch"), {}),
    ((), {KV_WORLDS_VARIABLE: "0"}),
    ((), {KV_KERNELS_VARIABLE: "torch"}),
    (("--kernel", "mine.py:slot_mapping"), {}),
], ids=["default", "kv-plugins", "kv-worlds-off", "torch-kv", "slot-plugin"])
def test_a_gpu_lockstep_run_warms_in_the_background_whatever_it_plugs_in(monkeypatch, extra, environment):
    """Without our KV kernels or KV worlds, a run still launches our data oracle's kernels."""
    monkeypatch.setattr(warm.device, "chooses_gpu", lambda preference: True)
    monkeypatch.setattr(warmed, "is_warm", lambda record: False)
    for name in (KV_WORLDS_VARIABLE, KV_KERNELS_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert not isinstance(warm.background(fuzz_args(*extra), 1), nullcontext)


@pytest.mark.parametrize("extra, gpu", [(("--no-warm",), True), (("--stateless",), True), ((), False)],
                         ids=["no-warm", "stateless", "interpreter"])
def test_no_background_warm_where_it_cannot_help(monkeypatch, extra, gpu):
    monkeypatch.setattr(warm.device, "chooses_gpu", lambda preference: gpu)
    monkeypatch.setattr(warmed, "is_warm", lambda record: False)
    assert isinstance(warm.background(fuzz_args(*extra), 1), nullcontext)


def test_no_background_warm_where_a_warm_before_left_every_variant(monkeypatch):
    monkeypatch.setattr(warm.device, "chooses_gpu", lambda preference: True)
    monkeypatch.setattr(warmed, "key", lambda: "a-key")
    monkeypatch.setattr(warmed, "is_warm", lambda record: record == "a-key")
    assert isinstance(warm.background(fuzz_args(), 1), nullcontext)
