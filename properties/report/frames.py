"""Where in the plug-in's own code an exception came from: the frames of its
chain outside the standard library, installed packages and blocktable's own four
folders (and in the kernel function's file), for reports and one-line errors."""

from __future__ import annotations

import functools
import sys
import sysconfig
import traceback
from collections.abc import Iterable
from pathlib import Path


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """Folders whose code is not the plug-in's: the standard library, installed
    packages, and blocktable's own four folders."""
    import blocktable
    import blocktable.kernels
    import blocktable.properties
    import blocktable.reference

    roots: set[str | None] = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots |= {str(Path(m.__file__).resolve().parent)
              for m in (blocktable, blocktable.kernels, blocktable.properties, blocktable.reference) if m.__file__}
    roots |= {str(Path(sys.prefix) / "lib"), str(Path(sys.base_prefix) / "lib")}
    return tuple(sorted(str(Path(r).resolve()) for r in roots if r))


def is_library_file(filename: str) -> bool:
    if filename.startswith("<"):  # frozen import machinery, exec'd strings
        return True
    resolved = str(Path(filename).resolve())
    return any(resolved == root or resolved.startswith(root + "/") for root in _library_roots())


def exception_chain(error: BaseException) -> list[BaseException]:
    """`error`, then what it was raised from (or during), outermost first."""
    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return chain


def plugin_frames(error: BaseException, kernel_files: Iterable[str] = ()) -> list[traceback.FrameSummary]:
    """The frames of `error`'s chain in the plug-in's own code (files outside the
    standard library, installed packages and blocktable, and `kernel_files`), in
    call order, each once."""
    own = {str(Path(f).resolve()) for f in kernel_files}
    frames, seen = [], set()
    for exc in reversed(exception_chain(error)):  # the innermost cause holds the plug-in's frames
        for frame in traceback.extract_tb(exc.__traceback__):
            key = (frame.filename, frame.lineno, frame.name)
            if key in seen:
                continue
            if str(Path(frame.filename).resolve()) in own or not is_library_file(frame.filename):
                seen.add(key)
                frames.append(frame)
        if isinstance(exc, SyntaxError) and exc.filename and not is_library_file(exc.filename):
            frames.append(traceback.FrameSummary(exc.filename, exc.lineno or 0, "<module>",
                                                 line=(exc.text or "").strip()))
    return frames


def where_text(error: BaseException, kernel_files: Iterable[str] = ()) -> str:
    """The innermost plug-in frame as " (at FILE:LINE)", for one-line messages."""
    frames = plugin_frames(error, kernel_files)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def exception_lines(error: BaseException, kernel_files: Iterable[str] = (), verbose: bool = False) -> list[str]:
    """Where in the plug-in's code the exception came from; with `verbose`, the whole
    chain as Python prints it."""
    lines = []
    frames = plugin_frames(error, kernel_files)
    if frames:
        raised = next((e for e in reversed(exception_chain(error)) if e.__traceback__ is not None), error)
        lines.append(f"  raised in the plug-in's code ({type(raised).__name__}; innermost call last):")
        for frame in frames:
            lines.append(f"    {frame.filename}:{frame.lineno} in {frame.name}")
            if frame.line:
                lines.append(f"        {frame.line.strip()}")
    if verbose and (error.__cause__ is not None or error.__context__ is not None or frames):
        lines.append("  the whole exception chain:")
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        lines.extend(f"    {line}" for line in text.rstrip().splitlines())
    return lines
