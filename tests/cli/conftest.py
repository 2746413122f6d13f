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


EXAMPLES = EXAMPLE_PLUGIN.parent


@pytest.fixture
def numpy_slots() -> tuple[str, str]:
    """`fuzz` arguments for the slot mapping that the class plug-ins' tests run beside
    the class: the numpy example, not our Triton kernel interpreted. Those tests check
    the class path (the protocol, the finding, its case, replay), for which any
    correct slot mapping does; it draws nothing, so a seed gives the same programs, at
    2.6 times the pace on the CPU (a 30-example `fuzz --pool ours`: 19.5 s, 7.6 s).
    Our kernel's lockstep is tests/properties/lockstep/test_driver.py's."""
    return ("--kernel", f"{EXAMPLE_PLUGIN}:slot_mapping")


@pytest.fixture
def plant_example(tmp_path):
    """plant_example("pool_class.py:ListPool", (old, new), ...) -> the spec of a copy of
    that example (FILE.py:NAME) with each one-line edit planted; `name`: the copy's."""

    def make(example: str, *edits: tuple[str, str], name: str | None = None) -> str:
        file, _, function = example.partition(":")
        source = (EXAMPLES / file).read_text()
        for old, new in edits:
            assert source.count(old) == 1, old
            source = source.replace(old, new)
        path = tmp_path / (name or file)
        path.write_text(source)
        return f"{path}:{function}"

    return make


@pytest.fixture
def case_file():
    """case_file(output) -> the case file a failing run's output names."""
    return lambda out: Path(out.split("case file: ")[1].split()[0])
