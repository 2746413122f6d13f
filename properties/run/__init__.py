"""The processes of a run, and a fuzz run told once.

1. The command line hands a `Job` (messages.py) to one child process (child.py,
   forked from a server with the libraries loaded: launch.py), or to a worker per
   core (workers.py).
2. The child sets itself up (prepare.py): the device, the Hypothesis profile
   (profiles.py), every module imported before anything is drawn, and everything
   under test loaded once.
3. It fuzzes (fuzz.py): the contract's examples, then the lockstep machine in
   seeded chunks, every step journaled before it runs (journal.py), the example
   database read first and saved to (database.py). The stateless modes are
   stateless.py; replaying a case is replay.py.
4. A failure goes to the parent as the case and its report (failure.py).
5. The parent confirms it in a fresh process and writes the case (confirm.py); a
   child that died leaves its journal, which becomes a case shrunk in fresh
   processes (crash.py); both are parent.py's to run.
"""
