"""`blocktable`: the command line. Each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from rich.text import Text

from blocktable.cli import bench, fuzz, mutants, progress, replay, selfcheck, warm
from blocktable.cli.common import EXIT_USAGE, UsageError, check_folder, errors, interrupted, usage_error


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors as every other usage error: one line on stderr (no usage
    block before it), with where to read more. Subcommands' parsers are of this
    class too (add_subparsers makes them of the parent's)."""

    def error(self, message: str) -> NoReturn:
        errors.print(Text.assemble((f"{self.prog}: ", "red"), f"{message} (see {self.prog} --help)"), soft_wrap=True)
        self.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="blocktable",
        description="Correctness and fuzzing harness for PagedAttention block tables and slot mapping.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench.add_parser(sub)
    fuzz.add_parser(sub)
    mutants.add_parser(sub)
    replay.add_parser(sub)
    selfcheck.add_parser(sub)
    warm.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # argparse exits 2 on a usage error, 0 on --help
        return int(exit.code or 0)
    try:
        progress.interval()  # the environment's settings, checked before any work too
    except ValueError as e:
        return usage_error(args.command, str(e))
    out = getattr(args, "out", None)
    if isinstance(out, Path):  # every command's output folder, checked before any work
        try:
            check_folder(out, "--out")
        except UsageError as e:
            return usage_error(args.command, str(e))
    try:
        return int(args.run(args))
    except KeyboardInterrupt:  # a command with more to keep (fuzz) says so itself
        return interrupted(args.command, "nothing kept")


if __name__ == "__main__":
    sys.exit(main())
