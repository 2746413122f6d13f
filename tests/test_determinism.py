"""The ci profile's promise: a seeded test draws the same examples in every process,
whatever ran before it in that process (xdist hands each worker a different mix)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

DRAWS = '''
import hashlib, os
from hypothesis import given
from blocktable.properties.slot import draw as strategies

@given(case=strategies.slot_cases())
def test_draw(case):
    digest = hashlib.sha1(repr((case.config, case.query_start_loc.tolist(), case.positions.tolist(),
                                case.block_table.tolist(), case.max_num_tokens)).encode()).hexdigest()
    with open(os.environ["DRAWS_FILE"], "a") as f:
        f.write(digest + "\\n")
'''

# A test that, run first, brings many of the package's modules into the process.
IMPORTS = '''
def test_imports_the_command_line():
    import blocktable.cli.main  # noqa: F401
'''


def draws(folder: Path, files: list[str], name: str) -> list[str]:
    out = folder / name
    env = {**os.environ, "DRAWS_FILE": str(out), "BLOCKTABLE_DEVICE": "cpu", "BLOCKTABLE_PROFILE": "ci"}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *files],
                   cwd=folder, env=env, check=True, capture_output=True)
    return out.read_text().split()


def test_draws_do_not_depend_on_what_ran_before(tmp_path):
    shutil.copy(Path(__file__).parent / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_a_imports.py").write_text(IMPORTS)
    (tmp_path / "test_b_draws.py").write_text(DRAWS)
    alone = draws(tmp_path, ["test_b_draws.py"], "alone.txt")
    after = draws(tmp_path, ["test_a_imports.py", "test_b_draws.py"], "after.txt")
    assert len(alone) >= 10
    assert alone == after


def test_the_stray_module_check_names_modules_with_source_only(tmp_path):
    """tests/conftest.py fails a test that leaves a local module in sys.modules, since
    Hypothesis would mix the module's literals into later draws. It reads them from
    source, so an extension module (a Triton launcher loaded from its cache folder on
    a GPU) changes nothing and must not fail the test that compiled it."""
    import importlib.machinery
    import types

    here = Path(__file__).with_name("conftest.py")
    conftest = next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(here))
    source = tmp_path / "stray_probe.py"
    source.write_text("LIMIT = 12345\n")
    launcher = tmp_path / f"launcher_probe{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    launcher.write_bytes(b"")
    modules = {}
    for name, path in (("stray_probe", source), ("launcher_probe", launcher)):
        modules[name] = types.ModuleType(name)
        modules[name].__file__ = str(path)
    try:
        sys.modules.update(modules)
        found = conftest._local_modules_outside_the_package()
    finally:
        for name in modules:
            sys.modules.pop(name, None)
    assert found == [f"stray_probe ({source})"]
