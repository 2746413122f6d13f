"""A case file's schema, by version: what every field must be, checked before
anything runs. A file that fails is refused with a message naming the field
(CaseError); `fields` turns a valid document into the case's fields."""

from __future__ import annotations

from typing import Any

from blocktable.plugin import CLASS_KINDS, KV_KINDS, V2_KINDS
from blocktable.properties.kv.call import check_call
from blocktable.properties.lockstep.schema import check_program, type_name
from blocktable.properties.v2.call import check_call as check_v2_call
from blocktable.properties.world import WorldConfig

FORMAT = "blocktable-case"
VERSION = 2
READABLE = (1, 2)  # version 1: no confirmation and no whole run
KINDS = ("lockstep", "slot-call", "kv-call", "v2-call")
CALL_CONFIG = ("kv_block_size", "kernel_block_size", "cp_world_size", "cp_rank", "cp_interleave")


class CaseError(ValueError):
    """A case file that cannot be replayed as it stands: missing, unreadable, or not
    what its version's schema says. The message names the file and the problem."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(data: dict[str, Any], key: str, check: Any, want: str, where: str = "") -> Any:
    if key not in data:
        raise CaseError(f"{where}{key!r} is missing")
    value = data[key]
    if not check(value):
        raise CaseError(f"{where}{key!r} must be {want}, not {type_name(value)}")
    return value


def fields(data: Any) -> dict[str, Any]:
    """The case's fields (Case's keywords) of a document that passes its version's
    schema; CaseError naming the first problem otherwise."""
    if not isinstance(data, dict):
        raise CaseError(f"not a blocktable case file (the JSON is {type_name(data)}, not an object)")
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
        raise CaseError(f"'provenance' must be an object, not {type_name(provenance_data)}")
    confirmation = data.get("confirmation") if version >= 2 else None
    if confirmation is not None and not (isinstance(confirmation, dict)
                                         and isinstance(confirmation.get("reproduced"), bool)):
        raise CaseError("'confirmation' must be null or an object with 'reproduced' true or false")
    kv = data.get("kv") or {}
    if not (isinstance(kv, dict) and all(k in KV_KINDS and isinstance(v, str) and v.strip()
                                         for k, v in kv.items())):
        raise CaseError("'kv' must be an object naming a KV plug-in for each of write, copy, gather it lists")
    strict_nan = data.get("strict_nan", False)
    if not isinstance(strict_nan, bool):
        raise CaseError(f"'strict_nan' must be true or false, not {type_name(strict_nan)}")
    v2 = data.get("v2") or {}
    if not (isinstance(v2, dict) and all(k in V2_KINDS and isinstance(v, str) and v.strip()
                                         for k, v in v2.items())):
        raise CaseError("'v2' must be an object naming a V2 plug-in for each of append, gather, slots it lists")
    classes = data.get("classes") or {}
    if not (isinstance(classes, dict) and all(k in CLASS_KINDS and isinstance(v, str) and v.strip()
                                              for k, v in classes.items())):
        raise CaseError(f"'classes' must be an object naming a class plug-in for each of "
                        f"{', '.join(CLASS_KINDS)} it lists")
    if classes and kind != "lockstep":
        raise CaseError(f"'classes' names class plug-ins, which only a lockstep case runs, not a {kind} case")
    case: dict[str, Any] = dict(kind=kind, kernel=kernel, failure=failure, provenance=provenance_data,
                                confirmation=confirmation, kv=dict(kv), strict_nan=strict_nan, v2=dict(v2),
                                classes=dict(classes))
    if kind == "lockstep":
        world = _world(_require(data, "world", lambda v: isinstance(v, dict), "an object (the world)"), "world")
        program = _program(_require(data, "program", lambda v: isinstance(v, list), "a list of steps"), world,
                           "program")
        if step is not None and step >= len(program):
            raise CaseError(f"the failure is at step {step + 1} but 'program' has {len(program)} steps "
                            f"(truncated or edited?)")
        case.update(world=world, program=program)
    elif kind in ("kv-call", "v2-call"):
        check = check_call if kind == "kv-call" else check_v2_call
        try:
            case["call"] = check(_require(data, "call", lambda v: isinstance(v, dict), "an object (the call)"))
        except ValueError as e:
            raise CaseError(str(e)) from None
    else:
        case["call"] = _call(_require(data, "call", lambda v: isinstance(v, dict), "an object (the call)"))
    whole = data.get("whole_run") if version >= 2 else None
    if whole is not None:
        case["whole_run"] = _whole_run(whole)
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


def _program(steps: list[Any], world: WorldConfig, where: str) -> list[dict[str, Any]]:
    try:
        check_program(steps, world.max_num_reqs, len(world.vocabulary))
    except ValueError as e:
        raise CaseError(f"{where} {e}") from None
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
        raise CaseError(f"'whole_run' must be an object, not {type_name(whole)}")
    _require(whole, "contract_examples", lambda v: _is_int(v) and v >= 0, "an integer >= 0", "whole_run: ")
    programs = _require(whole, "programs", lambda v: isinstance(v, list), "a list", "whole_run: ")
    for i, entry in enumerate(programs):
        where = f"whole_run program {i + 1}"
        if not isinstance(entry, dict):
            raise CaseError(f"{where} must be an object with 'world' and 'program'")
        world = _world(_require(entry, "world", lambda v: isinstance(v, dict), "an object", f"{where}: "), where)
        _program(_require(entry, "program", lambda v: isinstance(v, list), "a list", f"{where}: "), world, where)
    return whole
