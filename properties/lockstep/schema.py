"""The lockstep's steps as data: each operation, its arguments and what they name.

A step is a plain dict (`{"op": "step", "query": [...], "pad": 1}`), so a program is
a list of them: the state machine (lockstep/machine.py) makes them, case files store
them, `blocktable replay` applies them again. This table is the one statement of
what a step may hold: the driver dispatches through it (lockstep/driver.py), case
files are checked against it (cases/schema.py), and a test holds the operations'
signatures to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The refused calls (lockstep/rejections.py). Their order is part of what a seed
# means: the machine draws a kind from it by index, so a new kind goes at the end.
REJECTION_KINDS: tuple[str, ...] = ("row-overflow", "double-free", "free-duplicate", "over-allocate", "fork-unknown")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Type:
    """What a JSON value must be: a check and how messages say it."""

    check: Callable[[Any], bool]
    want: str


INT = Type(_is_int, "an integer")
BOOL = Type(lambda v: isinstance(v, bool), "true or false")
INTS = Type(lambda v: isinstance(v, list) and all(map(_is_int, v)), "a list of integers")
INTS_OR_NULL = Type(lambda v: v is None or INTS.check(v), "a list of integers or null")
KIND = Type(lambda v: isinstance(v, str), "a string")


@dataclass(frozen=True)
class Arg:
    name: str
    type: Type
    required: bool = True
    names: str | None = None  # what an integer argument names: "row" or "request"


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple[Arg, ...] = ()
    creates_request: bool = False  # request ids are handed out in order by these


OPS: dict[str, Op] = {op.name: op for op in (
    Op("add", (Arg("prompt", INTS_OR_NULL, required=False),), creates_request=True),
    Op("step", (Arg("query", INTS), Arg("pad", INT, required=False))),
    Op("fork", (Arg("parent", INT, names="request"),), creates_request=True),
    Op("finish", (Arg("request", INT, names="request"), Arg("clear", BOOL, required=False))),
    Op("preempt", (Arg("request", INT, names="request"),)),
    Op("resume", (Arg("request", INT, names="request"),)),
    Op("move", (Arg("src", INT, names="row"), Arg("dst", INT, names="row"))),
    Op("swap", (Arg("a", INT, names="row"), Arg("b", INT, names="row"))),
    Op("condense"),
    Op("reject", (Arg("kind", KIND), Arg("which", INT, required=False))),
    Op("reset"),
)}


def check_program(steps: list[Any], max_num_reqs: int, vocabulary: int = 0) -> None:
    """Every step of a program against the table: ValueError naming the step (from 1)
    and the problem. Request ids must name a request an earlier step made, row
    indices a row of the world, and in a world with a vocabulary of that many symbols
    (WorldConfig.vocabulary) a prompt's symbols one of them."""
    created = 0  # requests the steps so far can have made: an id at or past it names none
    for i, step in enumerate(steps):
        at = f"step {i + 1}: "
        if not isinstance(step, dict):
            raise ValueError(f"{at}must be an object with an 'op', not {type_name(step)}")
        op = OPS.get(step.get("op"))  # type: ignore[arg-type]
        if op is None:
            raise ValueError(f"{at}unknown operation {step.get('op')!r} (known: {', '.join(OPS)})")
        args = {arg.name: arg for arg in op.args}
        for name, value in step.items():
            if name == "op":
                continue
            if name not in args:
                raise ValueError(f"{at}{op.name} takes no argument {name!r} (it takes "
                                 f"{', '.join(args) or 'none'})")
            if not args[name].type.check(value):
                raise ValueError(f"{at}{op.name} {name}={value!r}: must be {args[name].type.want}")
            if _is_int(value) and value < 0 or (isinstance(value, list) and any(_is_int(v) and v < 0 for v in value)):
                raise ValueError(f"{at}{op.name} {name}={value!r}: must not be negative")
        missing = [arg.name for arg in op.args if arg.required and arg.name not in step]
        if missing:
            raise ValueError(f"{at}{op.name} needs {', '.join(missing)}")
        for arg in op.args:
            value = step.get(arg.name)
            if value is None:
                continue
            if arg.names == "row" and value >= max_num_reqs:
                raise ValueError(f"{at}{op.name} {arg.name}={value}: the world has rows 0 to {max_num_reqs - 1}")
            if arg.names == "request" and value >= created:
                raise ValueError(f"{at}{op.name} {arg.name}={value}: no step before it made request {value}")
        prompt = step.get("prompt") if op.name == "add" else None
        if vocabulary and prompt is not None and any(symbol >= vocabulary for symbol in prompt):
            raise ValueError(f"{at}add prompt={prompt!r}: the world's vocabulary has symbols 0 to {vocabulary - 1}")
        if op.name == "reject" and step["kind"] not in REJECTION_KINDS:
            raise ValueError(f"{at}unknown rejection kind {step['kind']!r}")
        created += op.creates_request


def type_name(value: Any) -> str:
    """A JSON value's type as messages name it."""
    if value is None:
        return "null"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)
