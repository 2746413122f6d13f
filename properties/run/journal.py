"""The crash journal: before each step runs, it is appended (and flushed) to a
JSON-lines file, so a kernel that kills its process (a segfault, an illegal
address) still leaves the configuration and every step up to the fatal one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None

    def start(self, header: dict[str, Any]) -> None:
        """A new run: the journal holds only the current run. The file stays open from
        run to run and is emptied in place (a fuzzing run starts a few dozen runs a
        second; opening the file anew cost more than all of a run's writes)."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w")
        else:
            self._file.seek(0)
            self._file.truncate()
        self.write(header)

    def write(self, record: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()  # survives the process dying; only the machine dying loses it

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    @staticmethod
    def read(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(header, steps) of the last run; a torn last line is dropped."""
        lines = path.read_text().splitlines()
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
        if not records:
            raise ValueError(f"journal {path} is empty")
        return records[0], records[1:]
