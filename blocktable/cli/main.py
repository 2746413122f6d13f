"""`blocktable`: the command line. Each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from blocktable.cli import bench, fuzz, mutants, replay, selfcheck


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blocktable",
        description="Correctness and fuzzing harness for PagedAttention block tables and slot mapping.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench.add_parser(sub)
    fuzz.add_parser(sub)
    mutants.add_parser(sub)
    replay.add_parser(sub)
    selfcheck.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # argparse exits 2 on a usage error, 0 on --help
        return int(exit.code or 0)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
