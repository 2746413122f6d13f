"""The crash journal (properties/journal.py): it holds the current run only, every
record is on disk as soon as it is written, and a torn last line is dropped."""

from blocktable.properties.run.journal import Journal


def run(journal: Journal, header: dict, *records: dict) -> None:
    journal.start(header)
    for record in records:
        journal.write(record)


def test_a_new_run_replaces_the_last_one_even_when_shorter(tmp_path):
    path = tmp_path / "deep" / "journal.jsonl"
    journal = Journal(path)
    run(journal, {"run": 1, "padding": "x" * 200}, *({"op": "step", "i": i} for i in range(5)))
    run(journal, {"run": 2}, {"op": "add"})
    # Read while still open: a process that dies here leaves exactly this behind.
    assert Journal.read(path) == ({"run": 2}, [{"op": "add"}])
    journal.close()
    assert Journal.read(path) == ({"run": 2}, [{"op": "add"}])


def test_a_torn_last_record_is_dropped(tmp_path):
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    run(journal, {"run": 1}, {"op": "add"})
    journal.close()
    with path.open("a") as f:
        f.write('{"op": "st')
    assert Journal.read(path) == ({"run": 1}, [{"op": "add"}])
    run(journal, {"run": 2})  # after a close: begins afresh
    assert Journal.read(path) == ({"run": 2}, [])
