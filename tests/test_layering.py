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


# -- the import graph ------------------------------------------------------------------------


def module_name(path: Path) -> str:
    """The import name of a source file of the four folders."""
    for folder, root in PACKAGE_DIR.items():
        if root in path.parents and (folder != "blocktable" or not any(
                PACKAGE_DIR[n] in path.parents for n in ("reference", "kernels", "properties"))):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            prefix = ["blocktable"] if folder == "blocktable" else ["blocktable", folder]
            return ".".join(prefix + parts)
    raise AssertionError(f"{path} lies in none of the four folders")


MODULES = {module_name(p): p for folder in PACKAGE_DIR for p in sources(folder)}


def imports_of(path: Path) -> set[str]:
    """Every module of the package that `path` imports, at module level or inside a
    function, under `if TYPE_CHECKING:` too (an annotation is a dependency):
    `from a.b import c` names a.b.c when that is a module, else a.b."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            candidates = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                          for alias in node.names]
        else:
            continue
        for name in candidates:
            while name and name not in MODULES:  # `import a.b.c` of a name inside a module
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    found.discard(module_name(path))
    return found


GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), and any
    module that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_finds_a_planted_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert "blocktable.properties.lockstep.state" in GRAPH["blocktable.properties.lockstep.driver"]


def test_no_import_circle_anywhere():
    assert circles(GRAPH) == []


def _room(name: str) -> str:
    parts = name.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "properties" else ""


@pytest.mark.parametrize("room, forbidden", [("slot", ("lockstep", "run", "mutation", "cases", "report")),
                                             ("kv", ("lockstep", "run", "mutation", "cases", "report")),
                                             ("v2", ("lockstep", "run", "mutation", "cases", "report")),
                                             ("report", ("run", "mutation")),
                                             ("cases", ("run", "mutation", "report")),
                                             ("lockstep", ("run", "mutation", "report", "cases"))])
def test_rooms_import_downward_only(room, forbidden):
    for name, targets in GRAPH.items():
        if _room(name) == room:
            bad = sorted(t for t in targets if _room(t) in forbidden)
            assert not bad, f"{name} imports {bad}"


def test_the_ground_floor_of_properties_imports_no_room():
    """world, compare, outcome and fault are what every room stands on."""
    for leaf in ("world", "compare", "outcome", "fault"):
        targets = GRAPH[f"blocktable.properties.{leaf}"]
        assert not [t for t in targets if _room(t)], f"{leaf} imports {targets}"


def test_no_module_is_over_400_lines_and_properties_keeps_few_at_its_top():
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 400}
    assert not long
    top = sorted(p.name for p in PACKAGE_DIR["properties"].glob("*.py"))
    assert len(top) <= 6, top


def test_no_module_but_the_kernels_imports_triton(tmp_path):
    """Triton reads TRITON_INTERPRET once it is imported, and the backend is chosen
    only after a child process has imported the harness (blocktable/device.py): a
    module that imports triton at its top breaks the interpreter for every kernel
    (each launch then fails with "Cannot call @triton.jit'd outside of the scope of
    a kernel"). In a fresh process, every module outside blocktable.kernels, started
    outside the checkout: there `-c` would find the source folder blocktable/ before an
    installed (not editable) package, and it lacks the other three."""
    import subprocess

    program = (
        "import importlib, pkgutil, sys\n"
        "import blocktable, blocktable.properties, blocktable.reference\n"
        "for package in (blocktable, blocktable.properties, blocktable.reference):\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        if not info.name.startswith('blocktable.kernels'):\n"
        "            importlib.import_module(info.name)\n"
        "            if 'triton' in sys.modules:\n"
        "                sys.exit(print(info.name))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", f"triton imported at the top of (or through) {done.stdout.strip()}"
