"""The errors a user can act on. The CLI turns each into one line and an exit code."""

from __future__ import annotations


class RayaugError(Exception):
    """Base of every error rayaug reports to a user; `exit_code` is what the CLI returns."""

    exit_code = 1


class UsageError(RayaugError):
    """The user asked for something that cannot work (bad URI, missing credentials, conflict)."""

    exit_code = 2


class SpecError(UsageError):
    """A job spec failed validation; every message names the field path."""

    def __init__(self, source: str, messages: list[str]) -> None:
        self.source = source
        self.messages = messages
        super().__init__(f"{source}: " + "; ".join(messages))


class StorageError(RayaugError):
    """Storage kept failing after every retry."""


class JobFailed(RayaugError):
    """The job ran and could not finish (error budget exceeded, a stage failed)."""


def root_cause(error: BaseException) -> str:
    """The innermost error under Ray's wrappers (RayTaskError keeps it in `.cause`)."""
    seen: set[int] = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "cause", None) or error.__cause__
        if not isinstance(inner, BaseException):
            break
        error = inner
    if isinstance(error, RayaugError):
        # rayaug's messages are one line; Ray Data appends its retry advice on further lines
        # ("configure ray.data.DataContext ..."), which is about Ray's retries, not rayaug's.
        return str(error).split("\n", 1)[0]
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:400]}"
