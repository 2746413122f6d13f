"""Child targets for tests/properties/run/test_launch.py. A child imports its target
by module and name, so they live in a module of their own on sys.path (the test
prepends this folder), not in the test file."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from blocktable.properties.run.messages import Result

PROBE = "BLOCKTABLE_LAUNCH_PROBE"
AT_IMPORT = os.environ.get(PROBE)  # what the child's environment held when it imported this module


def report(job: Any, send: Any) -> None:
    """Send what the child saw: the probe variable now and at import, and SIGINT's handler."""
    handler = signal.getsignal(signal.SIGINT)
    seen = {"now": os.environ.get(PROBE), "at_import": AT_IMPORT,
            "sigint": "ignored" if handler is signal.SIG_IGN else
                      "KeyboardInterrupt" if handler is signal.default_int_handler else repr(handler)}
    send(Result("pass", message=json.dumps(seen)))
