"""What a wheel holds: every package folder of the repository is listed in
pyproject.toml, so that `pip install blocktable` (not only an editable install,
which maps the folders whole) imports every module; and what the suite says when the
repository's bare source folder shadows an installed wheel."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_in_the_wheel():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    assert sorted(found) == sorted(setuptools["packages"])


def test_the_bare_source_folder_is_refused_with_the_way_out(tmp_path):
    """After a plain `pip install .`, pytest run from the repository root imports the
    bare blocktable/ folder (no properties/ inside it) ahead of the installed package:
    the suite stops at once and says how to install instead of failing on an import."""
    shutil.copytree(ROOT / "blocktable", tmp_path / "bare" / "blocktable")
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "bare"), "BLOCKTABLE_DEVICE": "cpu"}
    # As without an editable install: its finder would map blocktable.properties to
    # properties/ whatever blocktable/ was imported from.
    run = ("import sys, pytest; sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in "
           "str(getattr(f, '__module__', ''))]; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:xdist']))")
    out = subprocess.run([sys.executable, "-c", run], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode != 0
    said = out.stdout + out.stderr
    assert "blocktable.properties" in said
    assert "not laid out as installed" in said
    assert str(tmp_path / "bare" / "blocktable") in said
    assert "pip install -e '.[test]'" in said
