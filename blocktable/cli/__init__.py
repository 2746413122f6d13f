"""The `blocktable` command line: the one place that ties the reference, the
implementation and the properties together."""


def main(argv=None) -> int:
    from blocktable.cli.main import main as run

    return run(argv)


__all__ = ["main"]
