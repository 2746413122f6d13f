"""Pieces the subcommands share: kernel names and specs, exit codes, where messages
go, output folders, the crash path, and replaying a case in fresh processes."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.text import Text

from blocktable.device import CHOICES

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
# Reports, tables and progress go to stdout; usage errors and warnings to stderr, so
# that a script reading stdout never mistakes an error for output. Piped output (CI
# logs, files) gets a wide console: reports and tables are read later.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
errors = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)


class UsageError(Exception):
    """Bad arguments or configuration: printed, exit 2."""


def usage_error(command: str, message: str) -> int:
    """Print a usage or configuration error on one line of stderr; the exit code."""
    errors.print(Text.assemble((f"blocktable {command}: ", "red"), message), soft_wrap=True)
    return EXIT_USAGE


def kernel_names() -> list[str]:
    """Every built-in kernel name, in one order: the implementation's, then the
    harness's. --help, error messages and docs/cli.md all list these."""
    from blocktable.plugin import builtin_kernels
    from blocktable.properties.reference_kernel import harness_kernels

    return [*builtin_kernels(), *harness_kernels()]


def add_kernel_and_device(parser: argparse.ArgumentParser, kernel_default: str | None = "triton") -> None:
    default = f" (default {kernel_default})" if kernel_default else ""
    parser.add_argument("--kernel", default=kernel_default, metavar="NAME|MODULE:FUNCTION|FILE.py:FUNCTION",
                        help=f"the slot-mapping kernel under test{default}: one of {', '.join(kernel_names())}, "
                             "or a plug-in (see docs/plugins.md)")
    parser.add_argument("--device", default="auto", choices=CHOICES,
                        help="where kernels run: auto (GPU if present), cpu (Triton interpreter), cuda")


def normalize_kernel(spec: str, names: list[str] | None = None, noun: str = "kernel") -> str:
    """File plug-ins become absolute paths, so a case file replays from anywhere.
    `names` and `noun`: another kind's built-in names and how messages call it."""
    names = kernel_names() if names is None else names
    where, colon, name = spec.rpartition(":")
    if colon and where.endswith(".py"):
        path = Path(where)
        if path.is_dir():
            raise UsageError(f"{noun} file {where} is a folder, not a file")
        if not path.is_file():
            raise UsageError(f"{noun} file {where} does not exist")
        if not name:
            raise UsageError(f"{noun} {spec!r} names no function after the colon")
        return f"{path.resolve()}:{name}"
    if not colon and spec.endswith(".py"):
        raise UsageError(f"{noun} {spec!r} names a file but no function: write {spec}:FUNCTION")
    if not colon and spec not in names:  # said here, before a process starts
        raise UsageError(f"unknown {noun} {spec!r}: use one of {', '.join(names)}, "
                         f"MODULE:FUNCTION or path/to/file.py:FUNCTION")
    return spec


def normalize_kv(kind: str, spec: str) -> str:
    """normalize_kernel for a KV kernel of `kind` ("write", "copy", "gather")."""
    from blocktable.plugin import KV_CONTRACTS, builtin_kv_kernels

    return normalize_kernel(spec, list(builtin_kv_kernels(kind)), KV_CONTRACTS[kind].noun)


def add_kv_kernels(parser: argparse.ArgumentParser) -> None:
    """--kv-write, --kv-copy, --kv-gather: the KV kernels under test (docs/contract.md §9)."""
    from blocktable.plugin import KV_CONTRACTS

    for kind, contract in KV_CONTRACTS.items():
        parser.add_argument(f"--kv-{kind}", metavar="NAME|MODULE:FUNCTION|FILE.py:FUNCTION",
                            help=f"the {contract.noun} under test (default: ours, triton; or torch, or a plug-in: "
                                 f"see docs/plugins.md)")


def check_folder(path: Path, flag: str) -> None:
    """UsageError, naming `flag` and the path, unless `path` is a folder blocktable can
    write in or one it can make."""
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"{flag} {path} is a file, not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{flag} {path}: no permission to write in this folder")
        return
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is a file, so no folder can be made there")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: no permission to make a folder in {parent}")


def make_folder(path: Path, flag: str) -> bool:
    """Make the folder `flag` names (checked first); whether it was made now."""
    check_folder(path, flag)
    if path.is_dir():
        return False
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot make the folder: {e.strerror or e}") from None
    return True


def write_case(data: dict[str, Any], path: Path) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
    except OSError as e:
        raise UsageError(f"cannot write the case file {path}: {e.strerror or e}") from None
    return path


# -- crashes ---------------------------------------------------------------------------


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
    if header.get("kind") == "kv-stateless-batch":
        from blocktable.properties.kv_stateless import kv_stateless_crash

        return None, kv_stateless_crash(header, exitcode), header.get("device", "unknown")
    if header.get("kind") in ("slot-call", "kv-call"):
        case = Case(header["kind"], header["kernel"], {}, call=header["call"])
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
    if case.kind in ("slot-call", "kv-call"):
        where = f"while running {(case.call or {}).get('name', 'a stateless call')}"
    else:
        where = f"during step {len(steps)}" if steps else "while building the world"
    case.failure = {"what": "crash", "message": f"the process {how} {where}", "step": len(steps) - 1 if steps else None}
    return f"the process running the kernel {how} {where}"


def render_crash(case: Any, message: str, path: Path, device: str, device_choice: str) -> str:
    from blocktable.properties.engine import case_config, replay_command
    from blocktable.properties.report import render

    return render(kernel=case.kernel, device=device, error=None, config_text=case_config(case),
                  program=case.program if case.kind == "lockstep" else None,
                  failed_step=case.failure.get("step"), replay_command=replay_command(path, case.kernel, device_choice),
                  title=f"blocktable: {message}")


# -- replaying a case in fresh processes ---------------------------------------------------


@dataclass
class Attempt:
    """One replay of a case in a fresh process."""

    status: str  # "pass", "fail" or "config-error"
    text: str = ""  # the report of a failure (a crash's too), or the configuration error
    result: Any = None  # the child's Result; None when it died
    crashed: bool = False
    whole_run: bool = False  # this replay ran the case's whole run, not its program


def replay_attempt(kernel: str, device: str, case_path: Path, case_data: dict[str, Any] | None = None,
                   whole_run: bool = False, verbose: bool = False,
                   on_log: Callable[[str], None] | None = None) -> Attempt:
    """Replay the case at `case_path` (or `case_data`, the file not yet written) in a
    fresh process, its journal in a scratch folder so that a crash is reported too."""
    from blocktable.properties.child import run_in_child
    from blocktable.properties.messages import Job, Log

    def on_message(message: Any) -> None:
        if on_log is not None and isinstance(message, Log):
            on_log(message.text)

    with tempfile.TemporaryDirectory() as scratch:
        journal = Path(scratch) / "journal.jsonl"
        job = Job(kernel, device=device, case=str(case_path), case_data=case_data, whole_run=whole_run,
                  verbose=verbose, journal=str(journal))
        outcome = run_in_child("blocktable.properties.engine:replay_child", job, on_message)
        result = outcome.result
        if result is None:
            case, message, where = crash_case(journal, outcome.exitcode)
            text = message if case is None else render_crash(case, message, case_path, where, device)
            return Attempt("fail", text, None, crashed=True, whole_run=whole_run)
    if result.status == "config-error":
        return Attempt("config-error", result.message, result, whole_run=whole_run)
    if result.status == "pass" or result.failure is None:
        return Attempt("pass", "", result, whole_run=whole_run)
    return Attempt("fail", result.failure.report, result, whole_run=whole_run)


def replay_case(case: Any, kernel: str, device: str, case_path: Path, verbose: bool = False,
                on_log: Callable[[str], None] | None = None) -> Attempt:
    """What `blocktable replay` runs once: the case in a fresh process and, if that
    passes and the case keeps the whole run that found it (it did not fail alone in
    a fresh process when found), the whole run in another."""
    attempt = replay_attempt(kernel, device, case_path, verbose=verbose, on_log=on_log)
    if attempt.status != "pass" or case.whole_run is None:
        return attempt
    return replay_attempt(kernel, device, case_path, whole_run=True, verbose=verbose, on_log=on_log)


def whole_run_text(whole: dict[str, Any]) -> str:
    """A whole run as reports name it: "8 contract examples, then 12 programs (340 steps)"."""
    programs = whole.get("programs", [])
    steps = sum(len(p.get("program", [])) for p in programs)
    examples = whole.get("contract_examples", 0)
    parts = [f"{examples} contract example{'s' if examples != 1 else ''}"] if examples else []
    if programs:
        parts.append(f"{len(programs)} program{'s' if len(programs) != 1 else ''} ({steps} steps)")
    dropped = whole.get("dropped", 0)
    return ", then ".join(parts) + (f"; the {dropped} programs before those are not kept" if dropped else "")
