"""`blocktable warm` and fuzz's background warm: nothing to compile under the
interpreter, a clear usage error for a bad count, and the background started only
where it helps (a lockstep run on a GPU, which launches our data oracle's kernels
whatever it plugs in, or a stateless run of our KV kernels on a GPU; unless a warm
before left its record)."""

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


def background(*extra):
    """fuzz's background warm for these flags (the KV kernels named as fuzz names them)."""
    args = fuzz_args(*extra)
    kv = {kind: getattr(args, f"kv_{kind}") for kind in ("write", "copy", "gather")
          if getattr(args, f"kv_{kind}") is not None}
    return warm.background(args, 1, kv)


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
    assert not isinstance(background(*extra), nullcontext)


@pytest.mark.parametrize("extra", [("--stateless", "--kv-write", "triton"),
                                   ("--stateless", "--kv-copy", "torch", "--kv-gather", "triton")],
                         ids=["write", "gather-among-plugins"])
def test_a_gpu_stateless_run_of_our_kv_kernels_warms_their_draws_in_the_background(monkeypatch, extra):
    monkeypatch.setattr(warm.device, "chooses_gpu", lambda preference: True)
    families = []
    monkeypatch.setattr(warmed, "key", lambda family="lockstep": families.append(family) or f"key-{family}")
    monkeypatch.setattr(warmed, "is_warm", lambda record: False)
    assert not isinstance(background(*extra), nullcontext)
    assert families == ["stateless-kv"]


@pytest.mark.parametrize("extra, gpu", [
    (("--no-warm",), True), (("--stateless",), True), (("--stateless", "--v2-append", "triton"), True),
    (("--stateless", "--kv-write", "torch"), True), (("--stateless", "--kv-write", "triton", "--no-warm"), True),
    ((), False), (("--stateless", "--kv-write", "triton"), False),
], ids=["no-warm", "stateless-slot", "stateless-v2", "stateless-kv-plugin", "stateless-kv-no-warm", "interpreter",
        "stateless-kv-interpreter"])
def test_no_background_warm_where_it_cannot_help(monkeypatch, extra, gpu):
    monkeypatch.setattr(warm.device, "chooses_gpu", lambda preference: gpu)
    monkeypatch.setattr(warmed, "is_warm", lambda record: False)
    assert isinstance(background(*extra), nullcontext)


@pytest.mark.parametrize("extra, family", [((), "lockstep"), (("--stateless", "--kv-write", "triton"), "stateless-kv")])
def test_no_background_warm_where_a_warm_before_left_every_variant(monkeypatch, extra, family):
    monkeypatch.setattr(warm.device, "chooses_gpu", lambda preference: True)
    monkeypatch.setattr(warmed, "key", lambda asked="lockstep": f"key-{asked}")
    monkeypatch.setattr(warmed, "is_warm", lambda record: record == f"key-{family}")
    assert isinstance(background(*extra), nullcontext)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_fuzz_hands_the_background_warm_the_kv_kernels_it_names(cli, monkeypatch, jobs):
    from blocktable.cli import fuzz

    handed = []
    monkeypatch.setattr(fuzz, "background", lambda args, jobs, kv: handed.append(kv) or nullcontext())
    code, out = cli("fuzz", "--stateless", "--kv-write", "triton", "--kv-gather", "torch", "--examples", "1",
                    "--jobs", jobs)
    assert code == 0, out
    assert handed == [{"write": "triton", "gather": "torch"}]
