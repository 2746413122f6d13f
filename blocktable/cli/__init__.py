"""The `blocktable` command line: the one place that ties the reference, the
implementation and the properties together. The entry point is
blocktable.cli.main:main; this package module imports nothing, so that its
commands (which import their siblings through it) make no import circle."""
