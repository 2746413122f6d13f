"""blocktable: the device-backed block table, pool and slot mapping under test, and
the harness (`blocktable.reference`, `blocktable.properties`) that proves them equal
to docs/contract.md."""

__version__ = "0.1.0"
