"""Pieces the subcommands share: kernel names and specs, exit codes, where messages
go, output folders, and how the parent's work shows (a Display)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from blocktable import plugin
from blocktable.device import CHOICES
from blocktable.properties.cases.credentials import masked
from blocktable.properties.run.parent import Display, Update

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
# Reports, tables and progress go to stdout; usage errors and warnings to stderr, so
# that a script reading stdout never mistakes an error for output. Piped output (CI
# logs, files) gets a wide console: reports and tables are read later.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
errors = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)


class UsageError(Exception):
    """Bad arguments or configuration: printed, exit 2."""


def usage_error(command: str, message: str) -> int:
    """Print a usage or configuration error on one line of stderr; the exit code.
    A URL's credentials never show, whichever check wrote the message."""
    errors.print(Text.assemble((f"blocktable {command}: ", "red"), masked(message)), soft_wrap=True)
    return EXIT_USAGE


def interrupted(command: str, kept: str) -> int:
    """Ctrl-C: one line on stderr saying what was kept; the exit code."""
    errors.print(Text.assemble((f"blocktable {command}: ", "red"), f"interrupted (Ctrl-C); {kept}"), soft_wrap=True)
    return EXIT_INTERRUPTED


def kernel_names() -> list[str]:
    """Every built-in kernel name, in one order: the implementation's, then the
    harness's. --help, error messages and docs/cli.md all list these."""
    from blocktable.properties.slot.truth import harness_kernels

    return [*plugin.builtin_kernels(), *harness_kernels()]


def add_kernel_and_device(parser: argparse.ArgumentParser, kernel_default: str | None = "triton",
                          device_default: str | None = "auto", device_help: str = "") -> None:
    default = f" (default {kernel_default})" if kernel_default else ""
    parser.add_argument("--kernel", default=kernel_default, metavar="NAME|MODULE:FUNCTION|FILE.py:FUNCTION",
                        help=f"the slot-mapping kernel under test{default}: one of {', '.join(kernel_names())}, "
                             "or a plug-in (see docs/plugins.md)")
    parser.add_argument("--device", default=device_default, choices=CHOICES,
                        help=device_help or "where kernels run: auto (GPU if present), cpu (Triton interpreter), cuda")


def normalize_kernel(spec: str, names: list[str] | None = None, noun: str = "kernel") -> str:
    """A spec checked before any process starts, file plug-ins made absolute so that a
    case file replays from anywhere. `names` and `noun`: another kind's built-in
    names and how messages call it."""
    try:
        found = plugin.findable(spec, kernel_names() if names is None else names, noun)
    except plugin.PluginError as e:
        raise UsageError(str(e)) from None
    return str(found.absolute())


def normalize_kv(kind: str, spec: str) -> str:
    """normalize_kernel for a KV kernel of `kind` ("write", "copy", "gather")."""
    return normalize_kernel(spec, list(plugin.builtin_kv_kernels(kind)), plugin.KV_CONTRACTS[kind].noun)


def add_call_timeout(parser: argparse.ArgumentParser) -> None:
    from blocktable.properties.run.calls import DEFAULT_CALL_TIMEOUT_S

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (value >= 0 and value < float("inf")):
            raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
        return value

    parser.add_argument("--call-timeout", type=seconds, default=DEFAULT_CALL_TIMEOUT_S, metavar="S",
                        help=f"a kernel call that has not returned after S seconds is a finding: the process is "
                             f"stopped and the program becomes a case, as for a crash "
                             f"(default {DEFAULT_CALL_TIMEOUT_S:g}; 0: no limit)")


def add_kv_kernels(parser: argparse.ArgumentParser) -> None:
    """--kv-write, --kv-copy, --kv-gather: the KV kernels under test (docs/contract.md §9)."""
    for kind, contract in plugin.KV_CONTRACTS.items():
        parser.add_argument(f"--kv-{kind}", metavar="NAME|MODULE:FUNCTION|FILE.py:FUNCTION",
                            help=f"the {contract.noun} under test (default: ours, triton; or torch, or a plug-in: "
                                 f"see docs/plugins.md)")


def normalize_v2(kind: str, spec: str) -> str:
    """normalize_kernel for a V2 block-table kernel of `kind` ("append", "gather", "slots")."""
    return normalize_kernel(spec, list(plugin.builtin_v2_kernels(kind)), plugin.V2_CONTRACTS[kind].noun)


def add_v2_kernels(parser: argparse.ArgumentParser) -> None:
    """--v2-append, --v2-gather, --v2-slots: vLLM V2's block-table kernels under test
    (docs/contract.md §10)."""
    for kind, contract in plugin.V2_CONTRACTS.items():
        parser.add_argument(f"--v2-{kind}", metavar="NAME|MODULE:FUNCTION|FILE.py:FUNCTION",
                            help=f"the {contract.noun} under test (default: ours, triton; or torch, or a plug-in: "
                                 f"see docs/plugins.md)")


def v2_specs(args: argparse.Namespace) -> dict[str, str]:
    """The --v2-* kernels named, normalized, by kind."""
    return {kind: normalize_v2(kind, getattr(args, f"v2_{kind}")) for kind in plugin.V2_KINDS
            if getattr(args, f"v2_{kind}", None) is not None}


def normalize_class(kind: str, spec: str) -> str:
    """normalize_kernel for a class plug-in of `kind` ("pool"): `ours`, MODULE:Class or
    FILE.py:Class."""
    return normalize_kernel(spec, list(plugin.builtin_classes(kind)), plugin.CLASS_CONTRACTS[kind].noun)


def add_classes(parser: argparse.ArgumentParser) -> None:
    """--table, --table-v2, --pool: a class under test in place of ours (docs/contract.md §11)."""
    parser.add_argument("--table", metavar="ours|MODULE:Class|FILE.py:Class",
                        help="a V1 multi-group block-table class under test in place of ours and of the slot-mapping "
                             "kernel, driven through the table protocol (ours: our table through the same protocol; "
                             "see docs/plugins.md)")
    parser.add_argument("--table-v2", metavar="ours|MODULE:Class|FILE.py:Class",
                        help="a V2 block-table class (vLLM's model runner V2) under test in place of ours and of the "
                             "V2 kernels, driven through the V2 table protocol in every world (ours: our V2 tables "
                             "through the same protocol; see docs/plugins.md)")
    parser.add_argument("--pool", metavar="ours|MODULE:Class|FILE.py:Class",
                        help="a block-pool class under test in place of ours, driven through the pool protocol "
                             "(ours: our pool through the same protocol; see docs/plugins.md)")


def class_specs(args: argparse.Namespace) -> dict[str, str]:
    """The class plug-ins named (--table, --table-v2, --pool), normalized, by kind."""
    return {kind: normalize_class(kind, getattr(args, plugin.attribute(kind))) for kind in plugin.CLASS_KINDS
            if getattr(args, plugin.attribute(kind), None) is not None}


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


@contextlib.contextmanager
def _activity(name: str, detail: str) -> Iterator[Update]:
    if not console.is_terminal:  # a log: a line now and one every few seconds (progress.py)
        from blocktable.cli.progress import PlainLines, interval

        lines = PlainLines(lambda text: console.print(text, markup=False, soft_wrap=True), interval())
        task = lines.add(name, None)
        lines.update(task, None, detail)
        yield lambda text: lines.update(task, None, text)
        return
    with Progress(TextColumn(f"[bold]{name}[/] {{task.fields[detail]}}"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task(name, detail=detail)
        yield lambda text: progress.update(task, detail=text)


DISPLAY = Display(note=lambda text: console.print(text, markup=False, soft_wrap=True), activity=_activity)
