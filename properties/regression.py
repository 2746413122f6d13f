"""What an emitted regression test calls: replay a case file in a fresh process (a
crashing kernel fails the test instead of killing pytest) and fail with the report
while the case still fails. A case that did not fail alone in a fresh process when
it was found keeps the whole run that found it; that is replayed too, as
`blocktable replay` does.

`blocktable.properties.regression.check_case` is imported by tests in users'
repositories: its name and arguments stay."""

from __future__ import annotations

from pathlib import Path

from blocktable.properties.cases.case import load
from blocktable.properties.report.report import render
from blocktable.properties.run.calls import DEFAULT_CALL_TIMEOUT_S
from blocktable.properties.run.confirm import replay_case


def check_case(path: Path, kernel: str | None = None, device: str = "auto",
               plugins: dict[str, dict[str, str]] | None = None) -> None:
    """`plugins`: by family ("kv", "v2", "classes") and kind, plug-ins in place of the case's
    (for a kv-call or v2-call case, one of its op in place of its kernel)."""
    path = Path(path)
    case = load(path)
    kv = dict((plugins or {}).get("kv") or {})
    v2 = dict((plugins or {}).get("v2") or {})
    op = (case.call or {}).get("op", "")
    if case.kind == "kv-call":
        kernel = kv.pop(op, None) or kernel
    elif case.kind == "v2-call":
        kernel = v2.pop(op, None) or kernel
    # A kernel that hangs fails the test instead of hanging pytest.
    attempt = replay_case(case, kernel or case.kernel, device, path, kv=kv, v2=v2,
                          classes=dict((plugins or {}).get("classes") or {}), call_timeout=DEFAULT_CALL_TIMEOUT_S)
    if attempt.status == "config-error":
        raise AssertionError(f"{path.name}: {attempt.text}")
    if attempt.status != "pass":
        text = render(attempt.report) if attempt.report is not None else attempt.text
        raise AssertionError(f"{path.name} still fails:\n{text}")
