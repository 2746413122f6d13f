"""The crash journal (properties/journal.py): it holds the current run only, every
record is on disk as soon as it is written, and a torn last line is dropped."""

from blocktable.properties.journal import Journal


def test_a_new_run_replaces_the_last_one_even_when_shorter(tmp_path):
    path = tmp_path / "deep" / "journal.jsonl"
    journal = Journal(path)
    journal.start({"run": 1, "padding": "x" * 200})
    for i in range(5):
        journal.write({"op": "step", "i": i})
    journal.start({"run": 2})
    journal.write({"op": "add"})
    # Read while still open: a process that dies here leaves exactly this behind.
    assert Journal.read(path) == ({"run": 2}, [{"op": "add"}])
    journal.close()
    assert Journal.read(path) == ({"run": 2}, [{"op": "add"}])


def test_a_torn_last_record_is_dropped(tmp_path):
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.start({"run": 1})
    journal.write({"op": "add"})
    journal.close()
    with path.open("a") as f:
        f.write('{"op": "st')
    assert Journal.read(path) == ({"run": 1}, [{"op": "add"}])


def test_start_after_close_begins_afresh(tmp_path):
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.start({"run": 1})
    journal.write({"op": "add"})
    journal.close()
    journal.start({"run": 2})
    assert Journal.read(path) == ({"run": 2}, [])
