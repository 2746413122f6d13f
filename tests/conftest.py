"""Suite-wide set-up: the Hypothesis profile, and the `rejects` helper that every
bad-input test uses (raised the right error, named the value, changed nothing)."""

from __future__ import annotations

import copy
import inspect
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from blocktable import device

try:
    from blocktable.properties.run import profiles, workers
except ModuleNotFoundError as error:
    # A plain `pip install .` run from the repository root: the bare source folder
    # blocktable/ shadows the installed package and has no properties/ inside it.
    if not (error.name or "").startswith("blocktable."):
        raise
    raise pytest.UsageError(
        f"{error}, so this `blocktable` is not laid out as installed: it was imported from "
        f"{os.path.dirname(device.__file__)}. Install the package editable (`pip install -e '.[test]'`, "
        "as README says), or run pytest from outside the repository root."
    ) from error


def _pin_worker_gpu() -> None:
    """On a multi-GPU runner each xdist worker takes its own GPU (gw0 -> 0, gw1 -> 1, ...)."""
    import torch

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and torch.cuda.is_available() and torch.cuda.device_count() > 1:
        device.block_while_waiting_if_asked()  # before set_device makes the context
        torch.cuda.set_device(int(worker[2:]) % torch.cuda.device_count())


def _one_thread_per_worker() -> None:
    """Under xdist every worker, and every process it starts (the CLI tests' fuzzing
    children), runs its numeric libraries on one thread, as `fuzz --jobs` does for its
    workers: with `-n auto` there is a worker per core already, and pools of a
    thread per core in each of them and their children oversubscribe the host many
    times over. A setting the user made stays."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for name in workers.THREAD_VARIABLES:
        os.environ.setdefault(name, "1")
    if os.environ.get("OMP_NUM_THREADS") == "1":
        workers.one_thread()


_pin_worker_gpu()
_one_thread_per_worker()
# Before any kernel module is imported: the GPU when there is one, else the
# interpreter (BLOCKTABLE_DEVICE=cpu forces it on a GPU machine).
BACKEND = device.select(os.environ.get("BLOCKTABLE_DEVICE", "auto"))
profiles.register_and_load()
profiles.collect_less()  # the suite is mostly lockstep runs


# Hypothesis mixes literals of every local module in sys.modules into its draws: with
# all of them imported first, every process draws the same examples.
profiles.import_every_module()


def _local_modules_outside_the_package() -> list[str]:
    """Modules imported since the last look whose literals Hypothesis would mix into
    its draws (its own rule for a local module), other than blocktable's own."""
    try:
        from hypothesis.internal.constants_ast import is_local_module_file
    except ImportError:  # another Hypothesis: its rule is not ours to guess
        return []
    found = []
    for name, module in list(sys.modules.items()):
        if id(module) in _SEEN_MODULES:
            continue
        _SEEN_MODULES.add(id(module))
        file = getattr(module, "__file__", None)
        if (file and os.path.isabs(file) and name.split(".")[0] != "blocktable"
                and is_local_module_file(file) and has_source(module)):
            found.append(f"{name} ({file})")
    return found


def has_source(module: Any) -> bool:
    """Whether Hypothesis can read literals from the module: it reads them from the
    module's source (inspect.getsourcefile), so an extension module has none. Triton's
    launchers on a GPU are such modules, loaded from its cache folder, which is local
    by Hypothesis's rule."""
    try:
        return inspect.getsourcefile(module) is not None
    except TypeError:  # a built-in module
        return False


_SEEN_MODULES: set[int] = set()
_local_modules_outside_the_package()  # what is here now is the same in every process


@pytest.fixture(autouse=True)
def _no_stray_local_module() -> Any:
    """A test that leaves a module of its own in sys.modules (a plug-in or probe written
    to a scratch folder and imported by name) changes what every later seeded test in
    this worker draws, since Hypothesis reads the literals of every local module there:
    the same seed then gives other programs depending on which tests ran before. Such a
    module belongs under tests/, which Hypothesis leaves out."""
    yield
    stray = _local_modules_outside_the_package()
    assert not stray, ("this test left modules in sys.modules whose literals change later draws: "
                       + ", ".join(stray) + " (put such a module under tests/, or import it without sys.modules)")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    # Before xdist's own: its default for -n hands each worker a contiguous slice of
    # the suite up front, and the slice that held the end-to-end CLI tests ran on for
    # minutes after the others were done. With worksteal an idle worker takes half
    # of the longest queue. An explicit --dist is the user's.
    if (config.pluginmanager.hasplugin("xdist") and config.getoption("dist") == "no"
            and config.getoption("numprocesses")):
        config.option.dist = "worksteal"


def pytest_configure(config: pytest.Config) -> None:
    # The ci profile is seeded: the same examples on every run and every machine.
    if profiles.active() == "ci" and config.getoption("hypothesis_seed", None) is None:
        config.option.hypothesis_seed = str(profiles.CI_SEED)


def pytest_report_header(config: pytest.Config) -> str:
    return f"blocktable kernels run on: {BACKEND.describe()}"


def interpreter_loops_fail() -> bool:
    """Triton 3.6's interpreter fails on loops with run-time bounds under numpy 2.4 and
    later (a loop bound arrives as a 1-element array), and our kernels have such loops.
    CPU runners install versions without the problem; a GPU host may not."""
    import triton

    version = lambda text: tuple(int(p) for p in text.split(".")[:2])  # noqa: E731
    return version(triton.__version__) < (3, 7) and version(np.__version__) >= (2, 4)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if interpreter_loops_fail():
        loops = pytest.mark.skip(reason="this triton's interpreter cannot run our kernels under this numpy "
                                        "(triton < 3.7, numpy >= 2.4)")
        for item in items:
            if "interpreted_loops" in item.keywords or ("loops" in item.keywords and BACKEND.interpreted):
                item.add_marker(loops)
    if BACKEND.name == "cuda":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (kernels run under the interpreter here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _snapshot(obj: Any) -> Any:
    """A deep copy of an object's state, tensors as numpy arrays."""
    if hasattr(obj, "state_snapshot"):
        return obj.state_snapshot()
    return copy.deepcopy(vars(obj))


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.dtype == b.dtype and np.array_equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return type(a) is type(b) and _equal(vars(a), vars(b))
    return a == b


@pytest.fixture
def rejects() -> Callable[..., pytest.ExceptionInfo]:
    """rejects(state, Error, "regex", fn, *args, **kw): fn(*args, **kw) raises Error
    whose message matches regex, and `state` (one object or a tuple of them) is
    exactly as before the call."""

    def check(state: Any, error: type[BaseException], match: str, fn: Callable, *args: Any, **kw: Any):
        objs = state if isinstance(state, tuple) else (state,)
        before = [_snapshot(o) for o in objs]
        with pytest.raises(error, match=match) as info:
            fn(*args, **kw)
        after = [_snapshot(o) for o in objs]
        for o, b, a in zip(objs, before, after):
            assert _equal(b, a), f"{type(o).__name__} changed although the call was rejected"
        return info

    return check


def escape(value: object) -> str:
    return re.escape(str(value))


@pytest.fixture(scope="session")
def backend() -> device.Backend:
    return BACKEND


@pytest.fixture
def kernels(backend: device.Backend) -> Callable[..., Any]:
    """kernels(slot="triton", **kv) -> the Plugins a lockstep run takes: the slot-mapping
    kernel by name or as a function, and KV kernels by kind (ours for the rest)."""
    from blocktable.properties.run.prepare import plugins_for

    def make(slot: Any = "triton", **kv: str) -> Any:
        return plugins_for(slot, kv, backend)

    return make


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Lockstep throughput, as each machine test recorded it (also under xdist)."""
    lines = [value for reports in terminalreporter.stats.values() for report in reports
             for name, value in getattr(report, "user_properties", []) if name == "lockstep"
             and getattr(report, "when", "") == "call"]
    if lines:
        terminalreporter.section("lockstep throughput")
        for line in lines:
            terminalreporter.write_line(line)
