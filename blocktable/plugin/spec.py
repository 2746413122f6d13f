"""How a kernel under test is named on the command line, in case files and in tests:
a built-in `NAME`, `MODULE:FUNCTION`, or `FILE.py:FUNCTION`. Every place that reads,
shortens, moves or stores such a name goes through `KernelSpec`."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path


class PluginError(ValueError):
    """The kernel named cannot be found or does not fit its contract."""


@dataclass(frozen=True)
class KernelSpec:
    """One of: `name` (a built-in), `module` and `function`, or `file` and `function`.
    `file` is kept as written (relative or absolute) until `absolute` or
    `relative_to` says otherwise."""

    name: str = ""
    module: str = ""
    file: str = ""
    function: str = ""

    @classmethod
    def parse(cls, text: str, noun: str = "kernel") -> KernelSpec:
        """The spec `text`; PluginError, naming `noun` and the text, when it is none.
        The last colon separates the function, so a path may hold colons."""
        if not text or not text.strip():
            raise PluginError(f"{noun} spec is empty: use a built-in name, MODULE:FUNCTION or FILE.py:FUNCTION")
        where, colon, function = text.rpartition(":")
        if not colon:
            if text.endswith(".py"):
                raise PluginError(f"{noun} {text!r} names a file but no function: write {text}:FUNCTION")
            return cls(name=text)
        if not where:
            raise PluginError(f"{noun} {text!r} names no module before the colon")
        if not function:
            raise PluginError(f"{noun} {text!r} names no function after the colon")
        if where.endswith(".py"):
            return cls(file=where, function=function)
        return cls(module=where, function=function)

    def __str__(self) -> str:
        if self.name:
            return self.name
        return f"{self.file or self.module}:{self.function}"

    @property
    def is_file(self) -> bool:
        return bool(self.file)

    def path(self, base: Path | None = None) -> Path:
        """A file spec's file, a relative one taken from `base` (the working folder if None)."""
        path = Path(self.file)
        return path if path.is_absolute() or base is None else base / path

    def absolute(self, base: Path | None = None) -> KernelSpec:
        """A file spec with its path made absolute (from `base`, or the working folder);
        any other spec as it is."""
        if not self.file:
            return self
        return replace(self, file=str(self.path(base).resolve()))

    def relative_to(self, folder: Path) -> KernelSpec:
        """A file spec with its path relative to `folder` (normalised, `/` separators)."""
        if not self.file:
            return self
        relative = os.path.relpath(Path(self.file).resolve(), Path(folder).resolve())
        return replace(self, file=Path(relative).as_posix())

    @property
    def short(self) -> str:
        """As tables name it: a file spec by its file's name, not its path."""
        return f"{Path(self.file).name}:{self.function}" if self.file else str(self)

    @property
    def stem(self) -> str:
        """For file names: `/x/grid_bug.py:slot_mapping` -> `grid-bug-slot-mapping`."""
        text = f"{Path(self.file).stem}-{self.function}" if self.file else str(self)
        stem = "".join(c if c.isalnum() else "-" for c in text).strip("-")
        while "--" in stem:
            stem = stem.replace("--", "-")
        return stem[:60] or "kernel"
