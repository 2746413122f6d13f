"""What blocktable changes in Triton's interpreter, and why: work the interpreter does
that changes nothing a kernel computes, taken out. `device.select` applies them when
it chooses the interpreter; each checks that this Triton's interpreter is built as
expected and otherwise leaves it alone. Triton is imported inside the functions: the
interpreter must be chosen (TRITON_INTERPRET) before Triton is first imported."""

from __future__ import annotations

from typing import Any


def speed_up() -> None:
    """All of the changes below."""
    skip_unasserted_overflow_checks()
    patch_the_language_once_per_process()


def skip_unasserted_overflow_checks() -> bool:
    """Stop Triton's interpreter from computing overflow checks it then discards.

    For every 32-bit integer +, - and * the interpreter redoes the operation in int64
    and compares it with the bounds, then hands the result to `device_assert`, which
    does nothing unless the interpreter's `debug` option is on (it never is: the
    interpreter ignores device assertions). That dead work was a third of an
    interpreted slot-mapping call. Nothing observable changes: no check that could
    fire is dropped. Returns whether the option was switched off (False where this
    Triton's interpreter has no such option, or debugging is on)."""
    import dataclasses

    try:
        from triton.runtime import interpreter as triton_interpreter

        builder = triton_interpreter.interpreter_builder
        options = builder.options
        if options.debug or not options.sanitize_overflow:
            return False
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    except (ImportError, AttributeError, TypeError):
        return False
    return True


def patch_the_language_once_per_process() -> bool:
    """Make Triton's interpreter patch triton.language once per process, not at every
    launch and every call of a `@triton.jit` helper inside one.

    A launch patches the language (tl.load and the rest become interpreted versions),
    walking each of its modules with inspect.getmembers, and restores it at the end;
    each helper call inside it walks them again, only to find every builtin already
    replaced. Those walks were a quarter of an interpreted lockstep run, and the
    launch's own a tenth after the helpers' were gone. Here a launch or call whose
    modules are all patched skips the walk; one that finds a module not yet patched
    (tl.core where the kernels so far had only tl) patches it, and nothing is
    restored. A process that chose the interpreter runs every kernel interpreted
    (select() is once per process), so no compiled kernel ever sees the patched
    language, and the language a kernel computes with is the same either way.
    Returns whether the patch is installed (False where this Triton's interpreter is
    built otherwise)."""
    try:
        from triton import language as tl
        from triton.runtime import interpreter as triton_interpreter

        original, empty_scope = triton_interpreter._patch_lang, triton_interpreter._LangPatchScope
    except (ImportError, AttributeError):
        return False
    if getattr(original, "once_per_process", False):
        return True

    def patched(lang: object) -> bool:
        # The patch replaces tl.load first and the rest after it, all or nothing.
        return not tl.core.is_builtin(getattr(lang, "load", None))

    def patch_lang(fn: Any) -> Any:
        langs = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
        if not (langs and all(patched(lang) for lang in langs)):
            original(fn)  # its scope is dropped: the patch stays
        return empty_scope()  # nothing for the launch to restore

    patch_lang.once_per_process = True  # type: ignore[attr-defined]
    triton_interpreter._patch_lang = patch_lang
    return True
