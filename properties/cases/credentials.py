"""Credentials never leave the process that uses them. A URL's user and password
(`redis://:SECRET@host:6379/0`) are shown as `redis://***@host:6379/0` in every
text blocktable writes or prints: case files (their provenance keeps the command
line), journals, reports, logs and error lines. Case files are attached to bug
reports and uploaded by CI, so the command that found a case must not carry the
password of the fleet's database."""

from __future__ import annotations

import re
from collections.abc import Iterable

# scheme://USERINFO@ where USERINFO runs to the last "@" before the host's end: a
# password with an unescaped "@" is still masked whole.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
MASK = "***"


def masked(text: str, also: Iterable[str | None] = ()) -> str:
    """`text` with every URL's credentials replaced by ***, and every secret in
    `also` (a password given another way) wherever it appears."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    for secret in also:
        if secret:
            text = text.replace(secret, MASK)
    return text
