"""rayaug: offline image augmentation as a resumable Ray Data batch job.

The Python API (`rayaug.api`, loaded on first use so that `import rayaug` stays light):
`run(job)`, `resume(uri)`, `extend(uri, views=)`, `open_output(uri)`, `load_job(job)`. Its
errors are those of `rayaug.errors`, importable from here too.
"""

from typing import TYPE_CHECKING

from rayaug.errors import JobFailed, RayaugError, SpecError, StorageError, UsageError

if TYPE_CHECKING:  # for type checkers and editors; at run time __getattr__ loads them
    from rayaug.api import OutputView, extend, load_job, open_output, resume, run

__version__ = "0.8.0"

_API = ("run", "resume", "extend", "open_output", "load_job", "OutputView")

__all__ = [
    "run",
    "resume",
    "extend",
    "open_output",
    "load_job",
    "OutputView",
    "JobFailed",
    "RayaugError",
    "SpecError",
    "StorageError",
    "UsageError",
    "__version__",
]


def __getattr__(name: str):
    if name in _API:
        from rayaug import api

        return getattr(api, name)
    raise AttributeError(f"module 'rayaug' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
