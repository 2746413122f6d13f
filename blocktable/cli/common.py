"""Pieces the subcommands share: kernel specs, exit codes, the crash path."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from blocktable.device import CHOICES

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
# Piped output (CI logs, files) gets a wide console: reports and tables are read later.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


class UsageError(Exception):
    """Bad arguments or configuration: printed, exit 2."""


def add_kernel_and_device(parser: argparse.ArgumentParser, kernel_default: str | None = "triton") -> None:
    parser.add_argument("--kernel", default=kernel_default, metavar="NAME|MODULE:FUNCTION|FILE.py:FUNCTION",
                        help="the slot-mapping kernel under test: triton (ours, default), triton-per-request, "
                             "reference, or a plug-in (see docs/plugins.md)")
    parser.add_argument("--device", default="auto", choices=CHOICES,
                        help="where kernels run: auto (GPU if present), cpu (Triton interpreter), cuda")


def normalize_kernel(spec: str) -> str:
    """File plug-ins become absolute paths, so a case file replays from anywhere."""
    where, colon, name = spec.rpartition(":")
    if colon and where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise UsageError(f"kernel file {where} does not exist")
        if not name:
            raise UsageError(f"kernel {spec!r} names no function after the colon")
        return f"{path.resolve()}:{name}"
    return spec


def crash_case(journal: Path, exitcode: int | None) -> tuple[Any, str, str]:
    """A case file from the journal of a child that died mid-step:
    (case, what happened, the device it ran on). The case is None where there is
    nothing to replay: a stateless batch, or a death before the first step."""
    from blocktable.properties.case import Case, provenance
    from blocktable.properties.child import describe_exit
    from blocktable.properties.journal import Journal
    from blocktable.properties.world import WorldConfig

    try:
        header, steps = Journal.read(journal)
    except (OSError, ValueError):
        return None, f"blocktable: the process running the kernel {describe_exit(exitcode)} before its first step", \
            "unknown"
    if header.get("kind") == "stateless-batch":
        return None, stateless_crash(header, exitcode), header.get("device", "unknown")
    if header.get("kind") == "slot-call":
        case = Case("slot-call", header["kernel"], {}, call=header["call"])
    else:
        case = Case("lockstep", header["kernel"], {}, world=WorldConfig.from_json(header["world"]),
                    program=steps)
    device = header.get("device", "unknown")
    case.provenance = provenance(device, exitcode=exitcode)
    return case, describe_crash(case, exitcode), device


def stateless_crash(header: dict[str, Any], exitcode: int | None) -> str:
    """A batch of `--stateless` is too big to journal: say which one, and how to
    run it again."""
    from blocktable.properties.child import describe_exit
    from blocktable.properties.engine import config_text

    config = config_text(f"batch {header['batch']}", header["config"], header["requests"], header["tokens"],
                         header["max_num_tokens"])
    return (f"blocktable: the process running the kernel {describe_exit(exitcode)} during stateless batch "
            f"{header['batch']}\n  kernel:  {header['kernel']}\n  device:  {header.get('device', 'unknown')}\n"
            f"  config:  {config}\n  no case file (the batch is too big to journal); the same seed "
            f"repeats it: blocktable fuzz --stateless --seed {header['seed']} --kernel {header['kernel']}")


def describe_crash(case: Any, exitcode: int | None) -> str:
    """Set the case's failure record from its (possibly shrunk) program; return the message."""
    from blocktable.properties.child import describe_exit

    how = describe_exit(exitcode)
    steps = case.program
    if case.kind == "slot-call":
        where = f"while running {(case.call or {}).get('name', 'a slot-mapping call')}"
    else:
        where = f"during step {len(steps)}" if steps else "while building the world"
    case.failure = {"what": "crash", "message": f"the process {how} {where}", "step": len(steps) - 1 if steps else None}
    return f"the process running the kernel {how} {where}"


def render_crash(case: Any, message: str, path: Path, device: str, device_choice: str) -> str:
    from blocktable.properties.engine import call_text, replay_command
    from blocktable.properties.report import render

    return render(kernel=case.kernel, device=device, error=None,
                  config_text=case.world.describe() if case.world else call_text(case.call or {}),
                  program=case.program if case.kind == "lockstep" else None,
                  failed_step=case.failure.get("step"), replay_command=replay_command(path, case.kernel, device_choice),
                  title=f"blocktable: {message}")
