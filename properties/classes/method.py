"""One call of a class plug-in's method, sorted into what the lockstep compares.

A refusal (docs/contract.md §11: `ValueError`, or a subclass, for a call the
contract rejects; `TypeError` for a wrong kind of argument) passes on as the plain
type, so that it compares with the reference's refusal by type; anything else the
method raises is the class's finding, a Discrepancy naming the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from blocktable.properties.compare import Discrepancy


def call_method(part: str, shown: Callable[[], str], fn: Callable, *args: Any) -> Any:
    """fn(*args). `part`: the report's part ("pool free"); `shown`: the call as the
    report writes it, made only when needed."""
    try:
        return fn(*args)
    except (ValueError, TypeError) as error:
        plain = ValueError if isinstance(error, ValueError) else TypeError
        if type(error) is plain:
            raise
        raise plain(f"{type(error).__name__}: {error}") from error
    except Exception as error:
        raise Discrepancy(part, f"{shown()} raised {type(error).__name__}: {error}") from error
