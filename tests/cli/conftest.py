"""Helpers for the command-line tests: run `blocktable` in-process (it does its
work in a child process anyway) and capture what it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from blocktable.cli.main import main

EXAMPLE_PLUGIN = Path(__file__).resolve().parents[2] / "examples" / "numpy_slot_mapping.py"


@pytest.fixture
def cli(capsys, monkeypatch, tmp_path):
    """cli(*args) -> (exit code, output), run from a scratch folder."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[int, str]:
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    return run


@pytest.fixture
def plugin_file(tmp_path):
    """plugin_file(old, new) -> a copy of the example plug-in with one edit planted."""

    def make(old: str = "", new: str = "", name: str = "kernel.py") -> Path:
        source = EXAMPLE_PLUGIN.read_text()
        if old:
            assert source.count(old) == 1, old
            source = source.replace(old, new)
        path = tmp_path / name
        path.write_text(source)
        return path

    return make
