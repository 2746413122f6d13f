"""The dependency direction is a rule of the project, so it is a test.

- reference/ imports numpy and the standard library only;
- the implementation (blocktable/ and kernels/) never sees the truth it is checked
  against: no import of blocktable.reference or blocktable.properties, except the
  command-line front (blocktable/cli/), which ties everything together;
- nothing imports the top-level names `kernels`, `reference` or `properties` (the
  PyPI project `kernels` is unrelated and must never be picked up).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import blocktable

PACKAGE_DIR = {
    "blocktable": Path(blocktable.__file__).parent,
    "reference": Path(blocktable.__file__).parent.parent / "reference",
    "kernels": Path(blocktable.__file__).parent.parent / "kernels",
    "properties": Path(blocktable.__file__).parent.parent / "properties",
}
if not PACKAGE_DIR["reference"].is_dir():  # a non-editable install nests them
    PACKAGE_DIR.update({name: PACKAGE_DIR["blocktable"] / name for name in ("reference", "kernels", "properties")})


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}: relative import; use absolute blocktable.* imports")
            names.append(node.module or "")
    return names


def sources(folder: str) -> list[Path]:
    """A folder's modules; for `blocktable`, without the three subpackages nested in
    it when the package is installed (not editable)."""
    nested = [PACKAGE_DIR[name] for name in ("reference", "kernels", "properties")] if folder == "blocktable" else []
    return sorted(p for p in PACKAGE_DIR[folder].rglob("*.py") if not any(n in p.parents for n in nested))


def test_all_four_folders_are_found():
    for name, path in PACKAGE_DIR.items():
        assert path.is_dir() and list(path.glob("*.py")), name


@pytest.mark.parametrize("path", sources("reference"), ids=lambda p: p.name)
def test_reference_imports_numpy_and_the_standard_library_only(path):
    for name in imported_modules(path):
        top = name.split(".")[0]
        allowed = top in sys.stdlib_module_names or top == "numpy" or name.startswith("blocktable.reference")
        assert allowed, f"{path.name} imports {name}"


@pytest.mark.parametrize("path", [p for p in sources("blocktable") if "cli" not in p.parts] + sources("kernels"),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_implementation_never_imports_the_truth(path):
    for name in imported_modules(path):
        assert not name.startswith(("blocktable.reference", "blocktable.properties")), f"{path} imports {name}"


@pytest.mark.parametrize("path", [p for f in PACKAGE_DIR for p in sources(f)], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_top_level_kernels_reference_or_properties(path):
    for name in imported_modules(path):
        assert name.split(".")[0] not in ("kernels", "reference", "properties"), f"{path} imports {name}"


def test_our_kernels_package_cannot_be_shadowed(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "kernels", types.ModuleType("kernels"))  # an unrelated `kernels`
    import blocktable.kernels

    assert Path(blocktable.kernels.__file__).parent == PACKAGE_DIR["kernels"]
