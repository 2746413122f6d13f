"""The paired run: both sides driven through one program and compared after every
step (driver.py), the state it keeps (state.py), its steps as data (schema.py),
and the Hypothesis machine that writes the programs (machine.py)."""
