"""Case files: a failure as a versioned JSON document that replays in one command.

A case holds the configuration and the program (never a Hypothesis blob, which
breaks across Hypothesis versions), the failure as it was seen, whether it failed
again in a fresh process before the file was written, and provenance. Two kinds:

- "lockstep": a WorldConfig and a list of steps (lockstep/schema.py);
- "slot-call": one stateless slot-mapping call (config, query_start_loc,
  positions, block table, Tmax) with the reference's expected output;
- "kv-call": one call of a KV kernel (docs/contract.md §9; kv/call.py says what it
  holds); `kernel` is the KV plug-in under test;
- "v2-call": one call of a V2 block-table kernel (docs/contract.md §10; v2/call.py
  says what it holds); `kernel` is the V2 plug-in of the call's `op` under test.

A failure that did not repeat in a fresh process also keeps the whole run that
found it (`whole_run`): the contract examples and every lockstep program the
fuzzing process ran up to the failing one, so that a kernel that keeps state from
call to call can still be replayed.

A plug-in named by its file (`FILE.py:FUNCTION`: the kernel, the `kv` and
`v2` plug-ins) is stored with its path relative to the case file's folder and read
back from there: a folder of case files and the plug-ins beside them replays after
it moves (another checkout, an unpacked artifact).

Every file is checked against its version's schema (cases/schema.py) when it is
loaded (`load`), before anything runs: a hand-edited or truncated file is refused
with a message that names the file and the field, never replayed as a pass or
reported as a kernel's discrepancy.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocktable.plugin import CLASS_KINDS, KV_KINDS, V2_KINDS, KernelSpec, PluginError
from blocktable.properties.cases.confirmation import Confirmation
from blocktable.properties.cases.credentials import masked
from blocktable.properties.cases.schema import FORMAT, VERSION, CaseError, fields
from blocktable.properties.world import WorldConfig

# The plug-in families a case records beside its kernel, each a Case field of the
# same name, by kind: `replay` takes a --FAMILY-KIND flag for each kind, and the
# printed replay line names them. A family added here is replayable everywhere.
REPLAY_FAMILIES: dict[str, tuple[str, ...]] = {"kv": KV_KINDS, "v2": V2_KINDS, "classes": CLASS_KINDS}


def flag_of(family: str, kind: str) -> str:
    """The flag that names a plug-in of this family and kind: `--kv-gather`; a class
    plug-in's is its kind alone, `--pool`."""
    return f"--{kind}" if family == "classes" else f"--{family}-{kind}"


def label_of(family: str, kind: str) -> str:
    """How summaries and call counts name it: `kv-gather`, `pool`."""
    return flag_of(family, kind)[2:]


def family_flags(case: Case) -> list[str]:
    """`--kv-gather SPEC`, ... for every plug-in the case names in a replayable family."""
    return [f"{flag_of(family, kind)} {spec}" for family in REPLAY_FAMILIES
            for kind, spec in getattr(case, family).items()]


def provenance(device: str, **extra: Any) -> dict[str, Any]:
    import hypothesis
    import numpy
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # pragma: no cover - triton is a dependency on Linux
        triton_version = None
    import blocktable

    return {"python": platform.python_version(), "numpy": numpy.__version__, "torch": torch.__version__,
            "triton": triton_version, "hypothesis": hypothesis.__version__, "blocktable": blocktable.__version__,
            "device": device, "platform": platform.platform(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": masked(" ".join(sys.argv)), **extra}


@dataclass
class Case:
    kind: str  # "lockstep" | "slot-call" | "kv-call" | "v2-call"
    kernel: str
    failure: dict[str, Any]
    world: WorldConfig | None = None
    program: list[dict[str, Any]] = field(default_factory=list)
    call: dict[str, Any] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    # Whether the failure failed again when replayed in a fresh process before the
    # file was written. None: not checked (version 1 files, and a case not yet confirmed).
    confirmation: Confirmation | None = None
    # The whole run that found a failure that did not repeat alone:
    # {"contract_examples": n, "programs": [{"world": ..., "program": [...]}, ...],
    #  "dropped": programs left out at the start}. None: not kept.
    whole_run: dict[str, Any] | None = None
    # The KV plug-ins a lockstep case ran with, by kind ("write", "copy", "gather");
    # a kind not named ran ours.
    kv: dict[str, str] = field(default_factory=dict)
    # Found with NaN encodings held exactly (--strict-nan): its replays hold them so too.
    strict_nan: bool = False
    # The V2 block-table plug-ins it ran with, by kind ("append", "gather", "slots").
    v2: dict[str, str] = field(default_factory=dict)
    # The class plug-ins (docs/contract.md §11) it ran with, by kind ("pool").
    classes: dict[str, str] = field(default_factory=dict)

    def to_json(self, folder: Path | None = None) -> dict[str, Any]:
        """The case as its file holds it; with `folder` (where the file goes), file
        plug-ins relative to it."""
        def stored(spec: str) -> str:
            return spec if folder is None else relative_spec(spec, folder)

        data = {"format": FORMAT, "version": VERSION, "kind": self.kind, "kernel": stored(self.kernel),
                "failure": self.failure, "world": self.world.to_json() if self.world else None,
                "program": self.program, "call": self.call,
                "confirmation": self.confirmation.to_json() if self.confirmation else None,
                "provenance": self.provenance}
        if self.whole_run is not None:
            data["whole_run"] = self.whole_run
        if self.kv:
            data["kv"] = {kind: stored(spec) for kind, spec in self.kv.items()}
        if self.strict_nan:
            data["strict_nan"] = True
        if self.v2:
            data["v2"] = {kind: stored(spec) for kind, spec in self.v2.items()}
        if self.classes:
            data["classes"] = {kind: stored(spec) for kind, spec in self.classes.items()}
        return data

    @classmethod
    def from_json(cls, data: Any, where: str = "case file", folder: Path | None = None) -> Case:
        """The case, after checking `data` against its version's schema; CaseError
        names `where` (the file) and the first problem found. `folder`: the file's,
        which relative file plug-ins are read from."""
        try:
            found = fields(data)
        except CaseError as e:
            raise CaseError(f"{where}: {e}") from None
        if folder is not None:
            found["kernel"] = absolute_spec(found["kernel"], folder)
            for family in REPLAY_FAMILIES:
                found[family] = {kind: absolute_spec(spec, folder) for kind, spec in found[family].items()}
        confirmation = found.pop("confirmation")
        return cls(**found, confirmation=Confirmation.from_json(confirmation) if confirmation else None)

    def digest(self) -> str:
        """The same failure of the same kernel on the same input gives the same digest;
        a different kernel or failure, a different one."""
        body = json.dumps({"kind": self.kind, "kernel": self.kernel,
                           "failure": [self.failure.get("what"), self.failure.get("message")],
                           "world": self.world.to_json() if self.world else None,
                           "program": self.program, "call": self.call, "kv": self.kv,
                           **({"strict_nan": True} if self.strict_nan else {}),
                           **({"v2": self.v2} if self.v2 else {}),
                           **({"classes": self.classes} if self.classes else {})}, sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()[:10]

    def path_in(self, folder: Path) -> Path:
        """Where `save` puts the case: named by the plug-ins under test (each one's
        file and function: the KV and V2 plug-ins when any was named, else the kernel) and
        the digest, so that cases of different kernels never overwrite one another."""
        named = [*self.kv.values(), *self.v2.values(), *self.classes.values()] or [self.kernel]
        stems = "-".join(dict.fromkeys(kernel_stem(spec) for spec in named))
        return folder / f"case-{stems}-{self.digest()}.json"

    def save(self, folder: Path) -> Path:
        """Write the case into `folder` (made if needed) under its name; OSError if it
        cannot be written."""
        folder.mkdir(parents=True, exist_ok=True)
        path = self.path_in(folder)
        path.write_text(json.dumps(self.to_json(folder), indent=1) + "\n")
        return path


def kernel_stem(kernel: str) -> str:
    """`/x/grid_bug.py:slot_mapping` -> `grid-bug-slot-mapping`; `triton` -> `triton`."""
    try:
        return KernelSpec.parse(kernel).stem
    except PluginError:
        return "kernel"


def relative_spec(spec: str, folder: Path) -> str:
    """A file plug-in's spec with its path relative to `folder`; any other as it is."""
    try:
        parsed = KernelSpec.parse(spec)
    except PluginError:
        return spec
    return str(parsed.relative_to(folder)) if parsed.is_file else spec


def absolute_spec(spec: str, folder: Path) -> str:
    """A file plug-in's spec read from a case file in `folder`: a relative path is
    taken from there; any other spec as it is."""
    try:
        parsed = KernelSpec.parse(spec)
    except PluginError:
        return spec
    return str(parsed.absolute(folder)) if parsed.is_file else spec


def load(path: str | Path) -> Case:
    """Read and check a case file; CaseError (one line, naming the file) if it is
    missing, unreadable, not JSON or not a valid case."""
    path = Path(path)
    if path.is_dir():
        raise CaseError(f"case file {path} is a folder, not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CaseError(f"case file {path} does not exist") from None
    except UnicodeDecodeError:
        raise CaseError(f"case file {path} is not text (not UTF-8): not a case file") from None
    except OSError as e:
        raise CaseError(f"case file {path} cannot be read: {e.strerror or e}") from None
    if not text.strip():
        raise CaseError(f"case file {path} is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CaseError(f"case file {path} is not valid JSON (truncated?): {e}") from None
    return Case.from_json(data, where=f"case file {path}", folder=path.absolute().parent)
