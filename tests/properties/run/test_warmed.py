"""run/warmed.py: the record that a warm left every variant in Triton's cache. It
counts only when one count of processes left all of its shares, only under the key
it was made with (Triton's version, the host's GPUs, the package's text), and there
is none where the host's GPUs cannot be read; the interpreter leaves none."""

import uuid

import pytest
import torch
import triton

from blocktable.properties.run import warmed
from blocktable.properties.run.warm import warm


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A host with one GPU of `model` (the driver's page faked) and an empty cache."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    pages = tmp_path / "gpus"
    monkeypatch.setattr(warmed, "GPU_INFO", pages)

    def gpu(model="NVIDIA H200", bus="0000:18:00.0"):
        (pages / bus).mkdir(parents=True, exist_ok=True)
        (pages / bus / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 42\n")
    return gpu


def test_without_a_readable_gpu_there_is_no_key_and_nothing_is_warm(host, tmp_path):
    assert warmed.key() is None
    warmed.mark(0, 1, None)
    assert not (tmp_path / "cache").exists()
    assert not warmed.is_warm(None)


def test_warm_only_when_one_count_of_processes_left_every_share(host):
    host()
    record = warmed.key()
    assert record is not None
    assert not warmed.is_warm(record)
    warmed.mark(0, 2, record)
    warmed.mark(2, 3, record)
    warmed.mark(1, 3, record)
    assert not warmed.is_warm(record)  # 0 of 2 and 1, 2 of 3: no whole set
    warmed.mark(1, 2, record)
    assert warmed.is_warm(record)


def test_another_gpu_or_triton_makes_another_key(host, monkeypatch):
    host()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    record = warmed.key()
    warmed.mark(0, 1, record)
    assert record is not None and warmed.is_warm(warmed.key())
    version = triton.__version__
    monkeypatch.setattr(triton, "__version__", version + "-other")
    assert warmed.key() not in (None, record) and not warmed.is_warm(warmed.key())
    monkeypatch.setattr(triton, "__version__", version)
    assert warmed.key() == record
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the same host, another of its GPUs
    assert warmed.key() not in (None, record) and not warmed.is_warm(warmed.key())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    host("NVIDIA H100 80GB HBM3", bus="0000:2a:00.0")  # a second GPU on the host
    assert warmed.key() not in (None, record) and not warmed.is_warm(warmed.key())


def test_modules_installed_or_side_by_side_have_one_name_and_hidden_files_are_none(tmp_path):
    installed, checkout = tmp_path / "site" / "blocktable", tmp_path / "checkout"
    for root in (installed, checkout / "blocktable"):
        (root / "cli").mkdir(parents=True)
        (root / "cli" / "main.py").write_text("pass\n")
    for root in (installed / "kernels", checkout / "kernels"):
        root.mkdir()
        (root / "kv.py").write_text("pass\n")
        (root / ".#kv.py").symlink_to(tmp_path / "nowhere")  # what Emacs leaves beside a file being edited
    names = ["blocktable/cli/main.py", "kernels/kv.py"]
    assert [n for n, _ in warmed.modules({"blocktable": installed, "kernels": installed / "kernels"})] == names
    assert [n for n, _ in warmed.modules({"blocktable": checkout / "blocktable", "kernels": checkout / "kernels"})] \
        == names


def test_a_module_that_cannot_be_read_means_no_key(host, monkeypatch, tmp_path):
    host()
    sources = warmed._sources()
    assert warmed.key() is not None
    monkeypatch.setattr(warmed, "_sources", lambda: [*sources, ("kernels/gone.py", tmp_path / "gone.py")])
    assert warmed.key() is None


def test_the_interpreter_leaves_no_record(host):
    host()
    report = warm("cpu", 2, lambda what, error: None)
    assert report.done == report.total
    assert not warmed.is_warm(warmed.key())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_whole_warm_on_a_gpu_leaves_its_record(monkeypatch):
    """In the cache folder this run uses, under a key of the test's own (the parent
    hands the key to its processes), so that a record already there counts for
    nothing and none is left behind."""
    record = f"test-{uuid.uuid4().hex}"
    monkeypatch.setattr(warmed, "key", lambda: record)
    try:
        report = warm("cuda", 4, lambda what, error: None)
        assert report.done == report.total and not report.failed and not report.died
        assert warmed.is_warm(record)
    finally:
        folder = warmed._folder()
        for path in folder.glob(f"{record}.*") if folder is not None else ():
            path.unlink()
