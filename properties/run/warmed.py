"""Whether Triton's cache already holds every warm call's compilations: a record
that the warm processes leave in the cache folder, so that a fuzzing run on a host
warmed before starts no background warm (each would start torch and a CUDA context
beside the run only to find every variant cached).

A process that made all of its share of the calls without an error leaves one
empty file, `<key>.<index>-of-<processes>`, in `blocktable-warm/` inside the cache
folder; the cache counts as warm when one count of processes left all of its files.
The key names what the compilations depend on: Triton's version, the GPUs of this
host and the text of every module of this package (its kernels, the launch code
that picks their constants and the warm calls themselves), so that an upgrade, a
changed kernel or another GPU under the same folder finds no record and warms
again. Where that cannot be known (no record of the host's GPUs, no Triton cache
API) there is no key: the background warm always runs, as it did before the
record existed. A record that is wrong costs speed only: a variant missing from
the cache is compiled on first use.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

FOLDER = "blocktable-warm"
GPU_INFO = Path("/proc/driver/nvidia/gpus")  # the driver's page per GPU (Linux), readable without CUDA


def _gpu_models() -> list[str]:
    models = []
    for info in sorted(GPU_INFO.glob("*/information")):
        try:
            found = re.search(r"^Model:\s*(.+)$", info.read_text(), re.MULTILINE)
        except OSError:
            continue
        if found:
            models.append(found.group(1).strip())
    return models


def cache_folder() -> str | None:
    """Triton's cache folder, as Triton reads its settings."""
    try:
        from triton import knobs
    except ImportError:  # a Triton without its knobs: where its cache lies is not ours to guess
        return None
    return str(knobs.cache.dir)


def _folder() -> Path | None:
    cache = cache_folder()
    return Path(cache) / FOLDER if cache is not None else None


def _sources() -> list[tuple[str, Path]]:
    """Every module of the package by a name that is the same installed (one folder)
    and in a checkout (four folders side by side): its sub-package and its path there."""
    import blocktable
    import blocktable.kernels
    import blocktable.properties
    import blocktable.reference

    return modules({name: Path(str(package.__file__)).resolve().parent for name, package in (
        ("blocktable", blocktable), ("kernels", blocktable.kernels), ("properties", blocktable.properties),
        ("reference", blocktable.reference))})


def modules(folders: dict[str, Path]) -> list[tuple[str, Path]]:
    """The .py files in each named folder, a folder inside another counted once, as
    its own; an editor's hidden files (`.#kv.py`) are none."""
    found = {}
    for name, folder in folders.items():
        others = [other for other in folders.values() if other != folder and other.is_relative_to(folder)]
        for source in folder.rglob("*.py"):
            hidden = any(part.startswith(".") for part in source.relative_to(folder).parts)
            if not hidden and not any(source.is_relative_to(other) for other in others):
                found[f"{name}/{source.relative_to(folder)}"] = source
    return sorted(found.items())


def key(family: str = "lockstep") -> str | None:
    """What this host's compilations of a family of warm calls (run/warm.py) depend
    on, hashed; None where it cannot be known. The GPUs are all the host's, with the
    CUDA_VISIBLE_DEVICES that picks among them: a warm and a run on one host compile
    for the same GPU when that setting is the same."""
    import triton

    models = _gpu_models()
    if not models:
        return None
    digest = hashlib.sha256()
    digest.update(f"family {family}\ntriton {triton.__version__}\n".encode())
    digest.update("".join(f"gpu {model}\n" for model in models).encode())
    digest.update(f"visible {os.environ.get('CUDA_VISIBLE_DEVICES')}\n".encode())
    try:
        for name, source in _sources():
            digest.update(f"{name}\n".encode())
            digest.update(source.read_bytes())
    except OSError:  # a module that cannot be read: no key, so the run warms as without a record
        return None
    return digest.hexdigest()[:32]


def mark(index: int, processes: int, record: str | None) -> None:
    """Process `index` of `processes` made its whole share under `record` (a key)."""
    folder = _folder()
    if record is None or folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{record}.{index}-of-{processes}").touch()
    except OSError:  # a read-only cache: the runs warm again, which is only slower
        pass


def is_warm(record: str | None) -> bool:
    """Whether one count of processes left its whole set of files under `record`."""
    folder = _folder()
    if record is None or folder is None or not folder.is_dir():
        return False
    shares: dict[int, set[int]] = {}
    for path in folder.glob(f"{record}.*-of-*"):
        found = re.fullmatch(rf"{re.escape(record)}\.(\d+)-of-(\d+)", path.name)
        if found:
            shares.setdefault(int(found.group(2)), set()).add(int(found.group(1)))
    return any(done >= set(range(processes)) for processes, done in shares.items())
