"""blocktable.properties: where the reference and the implementation meet.

The ground floor is what every room stands on: `world` (a lockstep run's
configuration), `compare` (the one failure object, `Discrepancy`), `outcome`,
`fault`. The rooms: `slot` and `kv` (one kernel call at a time), `lockstep` (the
paired run), `cases` (case files), `report` (what a user reads), `run` (processes:
the fuzz run is told in its docstring), `mutation` (the gate). docs/design.md
walks the house.
"""
