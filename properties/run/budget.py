"""`--minutes M`: a wall-clock limit for the whole command, fuzzing, shrinking and
confirming a finding included, that it overshoots by at most 10% or 15 s, whichever
is larger (the slack: a program or a replay under way is not cut short).

The parent sets the times once, on `time.monotonic()` (one clock for every process
of a host on Linux): fuzzing stops starting programs at the `deadline`; Hypothesis's
shrinking of a finding stops at `shrink_until`, keeping the smallest failing program
it had met (the case says it was not shrunk further); what is left until `end` is
the fresh-process confirmation's, whose child is stopped if it would run past."""

from __future__ import annotations

from dataclasses import dataclass

SLACK_FRACTION = 0.1
SLACK_MIN_S = 15.0
CONFIRM_S = 20.0  # kept for confirming a finding, at most half the slack


def slack(seconds: float) -> float:
    """How far past the limit the command may end."""
    return max(SLACK_FRACTION * seconds, SLACK_MIN_S)


@dataclass(frozen=True)
class Budget:
    start: float  # time.monotonic() when the command started
    seconds: float  # the limit, 60 * M

    @property
    def deadline(self) -> float:
        """No program starts after this."""
        return self.start + self.seconds

    @property
    def end(self) -> float:
        """The command is over by then."""
        return self.deadline + slack(self.seconds)

    @property
    def shrink_until(self) -> float:
        """Shrinking a finding stops here, leaving the rest to confirm it."""
        return self.end - min(CONFIRM_S, slack(self.seconds) / 2)

    def left(self, now: float) -> float:
        return max(0.0, self.end - now)


class OutOfTime(KeyboardInterrupt):
    """Raised in a fuzzing child, between programs, when the time is up. A
    KeyboardInterrupt to Hypothesis: not the program's failure (to shrink), and not a
    fatal error either, whose choices it would save to the example database, where
    every later run (and every worker) would replay a program cut off mid-draw."""

    def __init__(self, shrinking: bool) -> None:
        super().__init__("shrinking" if shrinking else "fuzzing")
        self.shrinking = shrinking
