"""Case files: a failure as a versioned JSON document that replays in one command.

A case holds the configuration and the program (never a Hypothesis blob, which
breaks across Hypothesis versions), the failure as it was seen, whether it failed
again in a fresh process before the file was written, and provenance. Two kinds:

- "lockstep": a WorldConfig and a list of steps for properties.lockstep.Lockstep;
- "slot-call": one stateless slot-mapping call (config, query_start_loc,
  positions, block table, Tmax) with the reference's expected output;
- "kv-call": one call of a KV kernel (docs/contract.md §9; properties/kv_calls.py
  says what it holds); `kernel` is the KV plug-in under test.

A failure that did not repeat in a fresh process also keeps the whole run that
found it (`whole_run`): the contract examples and every lockstep program the
fuzzing process ran up to the failing one, so that a kernel that keeps state from
call to call can still be replayed.

Every file is checked against its version's schema when it is loaded (`load`),
before anything runs: a hand-edited or truncated file is refused with a message
that names the file and the field, never replayed as a pass or reported as a
kernel's discrepancy.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import inspect
import json
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blocktable.properties.world import WorldConfig

FORMAT = "blocktable-case"
VERSION = 2
READABLE = (1, 2)  # version 1: no confirmation and no whole run
KINDS = ("lockstep", "slot-call", "kv-call")
CALL_CONFIG = ("kv_block_size", "kernel_block_size", "cp_world_size", "cp_rank", "cp_interleave")


class CaseError(ValueError):
    """A case file that cannot be replayed as it stands: missing, unreadable, or not
    what its version's schema says. The message names the file and the problem."""


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
            "command": " ".join(sys.argv), **extra}


@dataclass
class Case:
    kind: str  # "lockstep" | "slot-call"
    kernel: str
    failure: dict[str, Any]
    world: WorldConfig | None = None
    program: list[dict[str, Any]] = field(default_factory=list)
    call: dict[str, Any] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    # Whether the failure failed again when replayed in a fresh process before the
    # file was written: {"reproduced": bool, "whole_run_reproduced": bool | None,
    # "note": str}. None: not checked (version 1 files).
    confirmation: dict[str, Any] | None = None
    # The whole run that found a failure that did not repeat alone:
    # {"contract_examples": n, "programs": [{"world": ..., "program": [...]}, ...],
    #  "dropped": programs left out at the start}. None: not kept.
    whole_run: dict[str, Any] | None = None
    # The KV plug-ins a lockstep case ran with, by kind ("write", "copy", "gather");
    # a kind not named ran ours.
    kv: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = {"format": FORMAT, "version": VERSION, "kind": self.kind, "kernel": self.kernel,
                "failure": self.failure, "world": self.world.to_json() if self.world else None,
                "program": self.program, "call": self.call, "confirmation": self.confirmation,
                "provenance": self.provenance}
        if self.whole_run is not None:
            data["whole_run"] = self.whole_run
        if self.kv:
            data["kv"] = self.kv
        return data

    @classmethod
    def from_json(cls, data: Any, where: str = "case file") -> "Case":
        """The case, after checking `data` against its version's schema; CaseError
        names `where` (the file) and the first problem found."""
        try:
            return _validated(data)
        except CaseError as e:
            raise CaseError(f"{where}: {e}") from None

    def digest(self) -> str:
        """The same failure of the same kernel on the same input gives the same digest;
        a different kernel or failure, a different one."""
        body = json.dumps({"kind": self.kind, "kernel": self.kernel,
                           "failure": [self.failure.get("what"), self.failure.get("message")],
                           "world": self.world.to_json() if self.world else None,
                           "program": self.program, "call": self.call, "kv": self.kv}, sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()[:10]

    def path_in(self, folder: Path) -> Path:
        """Where `save` puts the case: named by the kernel (its file and function) and
        the digest, so that cases of different kernels never overwrite one another."""
        return folder / f"case-{kernel_stem(self.kernel)}-{self.digest()}.json"

    def save(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = self.path_in(folder)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path


def kernel_stem(kernel: str) -> str:
    """`/x/grid_bug.py:slot_mapping` -> `grid-bug-slot-mapping`; `triton` -> `triton`."""
    where, colon, name = kernel.rpartition(":")
    if colon and where.endswith(".py"):
        where = Path(where).stem
    text = f"{where}-{name}" if colon else kernel
    stem = "".join(c if c.isalnum() else "-" for c in text).strip("-")
    while "--" in stem:
        stem = stem.replace("--", "-")
    return stem[:60] or "kernel"


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
    return Case.from_json(data, where=f"case file {path}")


# -- the schema ---------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(data: dict[str, Any], key: str, check: Any, want: str, where: str = "") -> Any:
    if key not in data:
        raise CaseError(f"{where}{key!r} is missing")
    value = data[key]
    if not check(value):
        raise CaseError(f"{where}{key!r} must be {want}, not {_type_name(value)}")
    return value


def _validated(data: Any) -> Case:
    if not isinstance(data, dict):
        raise CaseError(f"not a blocktable case file (the JSON is {_type_name(data)}, not an object)")
    if data.get("format") != FORMAT:
        raise CaseError(f"not a blocktable case file (format {data.get('format')!r}, expected {FORMAT!r})")
    version = data.get("version")
    if version not in READABLE:
        raise CaseError(f"case file version {version!r} is not supported (this blocktable reads versions "
                        f"{', '.join(map(str, READABLE))})")
    kind = data.get("kind")
    if kind not in KINDS:
        raise CaseError(f"unknown case kind {kind!r} (expected one of {', '.join(KINDS)})")
    kernel = _require(data, "kernel", lambda v: isinstance(v, str) and v.strip(), "a kernel name or spec")
    failure = _require(data, "failure", lambda v: isinstance(v, dict), "an object")
    step = failure.get("step")
    if step is not None and (not _is_int(step) or step < 0):
        raise CaseError(f"'failure.step' must be a step index (an integer >= 0) or null, not {step!r}")
    provenance_data = data.get("provenance") or {}
    if not isinstance(provenance_data, dict):
        raise CaseError(f"'provenance' must be an object, not {_type_name(provenance_data)}")
    confirmation = data.get("confirmation") if version >= 2 else None
    if confirmation is not None and not (isinstance(confirmation, dict)
                                         and isinstance(confirmation.get("reproduced"), bool)):
        raise CaseError("'confirmation' must be null or an object with 'reproduced' true or false")
    kv = data.get("kv") or {}
    if not (isinstance(kv, dict) and all(k in ("write", "copy", "gather") and isinstance(v, str) and v.strip()
                                         for k, v in kv.items())):
        raise CaseError("'kv' must be an object naming a KV plug-in for each of write, copy, gather it lists")
    case = Case(kind=kind, kernel=kernel, failure=failure, provenance=provenance_data, confirmation=confirmation,
                kv=dict(kv))
    if kind == "lockstep":
        case.world = _world(_require(data, "world", lambda v: isinstance(v, dict), "an object (the world)"), "world")
        case.program = _program(_require(data, "program", lambda v: isinstance(v, list), "a list of steps"),
                                case.world, "program")
        if step is not None and step >= len(case.program):
            raise CaseError(f"the failure is at step {step + 1} but 'program' has {len(case.program)} steps "
                            f"(truncated or edited?)")
    elif kind == "kv-call":
        from blocktable.properties.kv_calls import check_call

        try:
            case.call = check_call(_require(data, "call", lambda v: isinstance(v, dict), "an object (the call)"))
        except ValueError as e:
            raise CaseError(str(e)) from None
    else:
        case.call = _call(_require(data, "call", lambda v: isinstance(v, dict), "an object (the call)"))
    whole = data.get("whole_run") if version >= 2 else None
    if whole is not None:
        case.whole_run = _whole_run(whole)
    return case


def _world(data: dict[str, Any], where: str) -> WorldConfig:
    try:
        return WorldConfig.from_json(data)
    except KeyError as e:
        raise CaseError(f"'{where}' lacks the field {e.args[0]!r}") from None
    except TypeError as e:
        raise CaseError(f"'{where}' does not describe a world: {e}") from None
    except ValueError as e:
        raise CaseError(f"'{where}' is not a valid world: {e}") from None


def _annotation_check(annotation: Any) -> tuple[Any, str] | None:
    """(a check, what it wants) for an operation argument's annotation, from its
    text ("int", "list[int] | None", ...); None when any JSON value will do."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    checks = {"int": (_is_int, "an integer"), "bool": (lambda v: isinstance(v, bool), "true or false"),
              "str": (lambda v: isinstance(v, str), "a string"), "None": (lambda v: v is None, "null"),
              "float": (lambda v: _is_int(v) or isinstance(v, float), "a number"),
              "list[int]": (lambda v: isinstance(v, list) and all(map(_is_int, v)), "a list of integers")}
    parts = [p.strip() for p in text.split("|")]
    if not parts or any(p not in checks for p in parts):
        return None
    chosen = [checks[p] for p in parts]
    return (lambda v: any(c(v) for c, _ in chosen)), " or ".join(w for _, w in chosen)


@functools.lru_cache(maxsize=1)
def operations() -> dict[str, dict[str, tuple[bool, Any]]]:
    """Each lockstep operation's arguments: name -> (required, (check, want) or None),
    read from the operations themselves, so the schema follows properties/lockstep.py."""
    from blocktable.properties.lockstep import Lockstep

    ops = {}
    for op in Lockstep.OPS:
        params = list(inspect.signature(getattr(Lockstep, f"_{op}")).parameters.values())[1:]  # self
        ops[op] = {p.name: (p.default is inspect.Parameter.empty, _annotation_check(p.annotation))
                   for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return ops


ROW_ARGUMENTS = {"move": ("src", "dst"), "swap": ("a", "b")}  # row indices: below max_num_reqs
REQUEST_ARGUMENTS = {"fork": "parent", "finish": "request", "preempt": "request", "resume": "request"}
CREATES_REQUEST = ("add", "fork")  # request ids are handed out in order by these


def _program(steps: list[Any], world: WorldConfig, where: str) -> list[dict[str, Any]]:
    from blocktable.properties.rejections import REJECTIONS

    ops = operations()
    created = 0  # requests the steps so far can have made: an id at or past it names none
    for i, step in enumerate(steps):
        at = f"{where} step {i + 1}: "
        if not isinstance(step, dict):
            raise CaseError(f"{at}must be an object with an 'op', not {_type_name(step)}")
        op = step.get("op")
        if op not in ops:
            raise CaseError(f"{at}unknown operation {op!r} (known: {', '.join(ops)})")
        arguments = ops[op]
        for name, value in step.items():
            if name == "op":
                continue
            if name not in arguments:
                raise CaseError(f"{at}{op} takes no argument {name!r} (it takes "
                                f"{', '.join(arguments) or 'none'})")
            check = arguments[name][1]
            if check is not None and not check[0](value):
                raise CaseError(f"{at}{op} {name}={value!r}: must be {check[1]}")
            if _is_int(value) and value < 0 or (isinstance(value, list) and any(_is_int(v) and v < 0 for v in value)):
                raise CaseError(f"{at}{op} {name}={value!r}: must not be negative")
        missing = [name for name, (required, _) in arguments.items() if required and name not in step]
        if missing:
            raise CaseError(f"{at}{op} needs {', '.join(missing)}")
        for name in ROW_ARGUMENTS.get(op, ()):
            if step[name] >= world.max_num_reqs:
                raise CaseError(f"{at}{op} {name}={step[name]}: the world has rows 0 to {world.max_num_reqs - 1}")
        name = REQUEST_ARGUMENTS.get(op)
        if name is not None and step[name] >= created:
            raise CaseError(f"{at}{op} {name}={step[name]}: no step before it made request {step[name]}")
        if op == "reject" and step.get("kind") not in REJECTIONS:
            raise CaseError(f"{at}unknown rejection kind {step.get('kind')!r}")
        if op in CREATES_REQUEST:
            created += 1
    return steps


def _int_list(call: dict[str, Any], key: str) -> list[int]:
    return _require(call, key, lambda v: isinstance(v, list) and all(map(_is_int, v)), "a list of integers",
                    "call: ")


def _call(call: dict[str, Any]) -> dict[str, Any]:
    _require(call, "name", lambda v: isinstance(v, str), "a string", "call: ")
    config = _require(call, "config", lambda v: isinstance(v, dict), "an object", "call: ")
    for key in CALL_CONFIG:
        _require(config, key, _is_int, "an integer", "call: config ")
    qsl, positions = (_int_list(call, k) for k in ("query_start_loc", "positions"))
    width = _require(call, "width", lambda v: _is_int(v) and v >= 0, "an integer >= 0", "call: ")
    rows = _require(call, "block_table", lambda v: isinstance(v, list), "a list of rows", "call: ")
    if all(isinstance(row, list) for row in rows) and rows:  # rows of ids, as case files hold it
        if any(len(row) != width or not all(map(_is_int, row)) for row in rows):
            raise CaseError(f"call: every row of 'block_table' must be {width} integers ('width')")
        table = [x for row in rows for x in row]
    else:
        table = _int_list(call, "block_table")
    tmax = _require(call, "max_num_tokens", lambda v: _is_int(v) and v >= 0, "an integer >= 0", "call: ")
    if not qsl or qsl[0] != 0 or any(b < a for a, b in zip(qsl, qsl[1:])):
        raise CaseError("call: 'query_start_loc' must start at 0 and never decrease")
    if qsl[-1] != len(positions):
        raise CaseError(f"call: 'query_start_loc' ends at {qsl[-1]} but there are {len(positions)} positions")
    if tmax < len(positions):
        raise CaseError(f"call: 'max_num_tokens' {tmax} is smaller than the {len(positions)} positions")
    if any(p < 0 for p in positions):
        raise CaseError("call: 'positions' must not be negative")
    if (len(table) % width if width else len(table)):
        raise CaseError(f"call: 'block_table' holds {len(table)} ids, not whole rows of width {width}")
    count = len(table) // width if width else 0
    if width and count < len(qsl) - 1:
        raise CaseError(f"call: 'block_table' has {count} rows for {len(qsl) - 1} requests")
    return call


def _whole_run(whole: Any) -> dict[str, Any]:
    if not isinstance(whole, dict):
        raise CaseError(f"'whole_run' must be an object, not {_type_name(whole)}")
    _require(whole, "contract_examples", lambda v: _is_int(v) and v >= 0, "an integer >= 0", "whole_run: ")
    programs = _require(whole, "programs", lambda v: isinstance(v, list), "a list", "whole_run: ")
    for i, entry in enumerate(programs):
        where = f"whole_run program {i + 1}"
        if not isinstance(entry, dict):
            raise CaseError(f"{where} must be an object with 'world' and 'program'")
        world = _world(_require(entry, "world", lambda v: isinstance(v, dict), "an object", f"{where}: "), where)
        _program(_require(entry, "program", lambda v: isinstance(v, list), "a list", f"{where}: "), world, where)
    return whole
