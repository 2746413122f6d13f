"""The mutation gate: a catalogue of planted bugs (catalogue.py), each applied to a
scratch copy of the package and fuzzed (run.py, worker.py)."""
