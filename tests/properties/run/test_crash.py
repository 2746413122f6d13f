"""The crash shrinker's search (properties/crash.py), with a stand-in for the
child: a "program" crashes when it holds the steps a crash needs, in order."""

from blocktable.properties.run.crash import shrink_program, simplify_arguments


def crashes_when(needed: list[str], calls: list[int]):
    """A crash oracle: the program dies at the step completing `needed` as a
    subsequence, and the steps up to it are what it returns (as the journal would)."""

    def crashes(program):
        calls.append(len(program))
        want = 0
        for i, step in enumerate(program):
            if want < len(needed) and step["op"] == needed[want]:
                want += 1
                if want == len(needed):
                    return program[:i + 1]
        return None

    return crashes


def steps(ops: str) -> list[dict]:
    return [{"op": op} for op in ops.split()]


def test_shrinks_to_exactly_the_steps_the_crash_needs():
    calls: list[int] = []
    program = steps("a x b x x c x a b x y c x x")
    got = shrink_program(program, crashes_when(["a", "b", "c"], calls), lambda: False)
    assert [s["op"] for s in got] == ["a", "b", "c"]
    assert len(calls) < 40  # halving, not every subset


def test_a_program_that_is_already_minimal_is_kept():
    program = steps("a b")
    assert shrink_program(program, crashes_when(["a", "b"], []), lambda: False) == program


def test_stops_when_out_of_time():
    calls: list[int] = []
    program = steps("x " * 20 + "a")
    got = shrink_program(program, crashes_when(["a"], calls), lambda: len(calls) >= 1)
    assert len(calls) == 1 and len(got) <= len(program)


def test_removals_that_stop_the_crash_are_not_kept():
    program = steps("a b c")
    got = shrink_program(program, crashes_when(["a", "b", "c"], []), lambda: False)
    assert got == program


def test_arguments_become_as_small_as_the_crash_allows():
    """The crash needs a step scheduling at least 3 tokens for request 1; everything
    else can go to 0."""
    def crashes(program):
        for i, step in enumerate(program):
            if step["op"] == "step" and step["query"][1] >= 3:
                return program[:i + 1]
        return None

    program = [{"op": "add", "prompt": 40}, {"op": "step", "query": [17, 1000, 5], "pad": 6}]
    got = simplify_arguments(program, crashes, lambda: False)
    assert got == [{"op": "add", "prompt": 0}, {"op": "step", "query": [0, 3, 0], "pad": 0}]


def test_a_simpler_argument_that_moves_the_crash_earlier_is_not_taken_there():
    """Only same-length programs are kept here; removing steps is shrink_program's job."""
    def crashes(program):
        for i, step in enumerate(program):
            if step["n"] == 0 or (i == len(program) - 1 and step["n"] >= 1):
                return program[:i + 1]
        return None

    program = [{"op": "x", "n": 2}, {"op": "y", "n": 4}]
    got = simplify_arguments(program, crashes, lambda: False)
    assert got == [{"op": "x", "n": 1}, {"op": "y", "n": 0}]  # x = 0 would crash at step 1


def test_a_list_whose_values_the_crash_ignores_is_zeroed_in_one_replay():
    """A prompt's token ids do not matter to this crash: they all go to 0 at once, not
    one replay (and, each crashing, one fresh process) per element; the query, which
    does matter, still goes element by element."""
    tried = []

    def crashes(program):
        tried.append(program)
        for i, step in enumerate(program):
            if step["op"] == "step" and step["query"][1] >= 3:
                return program[:i + 1]
        return None

    program = [{"op": "add", "prompt": list(range(1, 21))}, {"op": "step", "query": [17, 1000, 5], "pad": 6}]
    got = simplify_arguments(program, crashes, lambda: False)
    assert got == [{"op": "add", "prompt": [0] * 20}, {"op": "step", "query": [0, 3, 0], "pad": 0}]
    assert all(candidate[0]["prompt"] == [0] * 20 for candidate in tried)  # the first candidate zeroed it
