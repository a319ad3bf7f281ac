"""A benchmark's arguments as its result file may print them: without the options that name a
path of the machine it ran on (they change no figure)."""

from __future__ import annotations


def without_paths(argv: list[str], path_options: tuple[str, ...]) -> list[str]:
    """argv less each of `path_options` and its value (`--opt VALUE` or `--opt=VALUE`)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in path_options:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in path_options)):
            kept.append(arg)
    return kept
