"""Case files: a failure as a versioned JSON document that replays in one command
(case.py), its schema by version (schema.py), and its confirmation (confirmation.py)."""
