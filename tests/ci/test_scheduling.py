"""The suite's own scheduling under xdist: `pytest -n N` steals work unless the user
picked a --dist mode (tests/conftest.py). xdist's default gave each worker a
contiguous slice up front; on the H200 one worker's slice of end-to-end CLI tests
ran on for minutes after the other fifteen were idle."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

SUITE_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def _suite_hook(config: pytest.Config):
    for plugin in config.pluginmanager.get_plugins():
        if Path(getattr(plugin, "__file__", "") or "").resolve() == SUITE_CONFTEST:
            return plugin.pytest_cmdline_main
    raise AssertionError(f"{SUITE_CONFTEST} is not a registered plug-in")


def _options(dist: str, numprocesses: object, xdist: bool = True) -> SimpleNamespace:
    option = SimpleNamespace(dist=dist, numprocesses=numprocesses)
    return SimpleNamespace(option=option, getoption=lambda name: getattr(option, name),
                           pluginmanager=SimpleNamespace(hasplugin=lambda name: xdist and name == "xdist"))


@pytest.mark.parametrize(("dist", "numprocesses", "expected"), [
    ("no", "auto", "worksteal"),  # `pytest -n auto`, the README's command
    ("no", 14, "worksteal"),
    ("load", "auto", "load"),  # the user's choice stands
    ("loadfile", 4, "loadfile"),
    ("no", 0, "no"),  # -n 0: no workers, nothing to schedule
    ("no", None, "no"),  # plain `pytest`
])
def test_workers_steal_work_unless_the_user_chose_a_mode(request, dist, numprocesses, expected):
    config = _options(dist, numprocesses)
    _suite_hook(request.config)(config)
    assert config.option.dist == expected


def test_without_xdist_the_options_are_left_alone(request):
    # `pytest -p no:xdist` has no --dist option to read.
    config = _options("no", "auto", xdist=False)
    _suite_hook(request.config)(config)
    assert config.option.dist == "no"
