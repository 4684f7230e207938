"""The input and output formats, found by name: one module per format, named after it.

A format module defines `INPUT` (an `InputFormat`), `OUTPUT` (an `OutputFormat`) or both; a
new format is its module and its name added below. A module is imported on first use, so the
spec can check names without loading any format, and a format whose package is missing (Lance
without `pylance`) fails with an install hint where it is used. Nothing else in rayaug compares
format names: what differs between formats is asked of the format.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING

from rayaug.errors import UsageError

if TYPE_CHECKING:
    from rayaug.formats.base import InputFormat, OutputFormat

INPUTS = ("parquet", "webdataset", "folder")  # the order `auto` looks for them in
OUTPUTS = ("parquet", "webdataset", "lance")
# Output formats that write through an object store of their own, which rayaug configures and
# has tested on these URI schemes only. Known without importing the format.
OUTPUT_SCHEMES = {"lance": ("file", "s3", "az", "abfss", "abfs")}
# Why such a format is refused on a scheme it is not wired for, where there is more to say.
NOT_WIRED = {
    # Checked with pylance 14.0.2 and gcp-storage-emulator 2026.7.19, the only GCS server here.
    ("lance", "gs"): (
        "Lance's GCS object store (endpoint: google_base_url) lists, probes and uploads large "
        "files through GCS's XML API (GET /BUCKET?list-type=2, HEAD /BUCKET/OBJECT, POST "
        "?uploads), which the GCS emulator rayaug is tested against (gcp-storage-emulator) "
        "answers with 501 Not Implemented, and Lance's JSON API store (use_opendal) rejects "
        "the emulator's upload answer (contentType null), so it is untested there"
    ),
}
AUTO = "auto"  # input.format: detected from the listed files' extensions
FALLBACK = "folder"  # what `auto` reads when no file is claimed by any input format


def input_format(name: str) -> InputFormat:
    return _module(name, INPUTS, "input").INPUT


def output_format(name: str) -> OutputFormat:
    return _module(name, OUTPUTS, "output").OUTPUT


def _module(name: str, names: tuple[str, ...], role: str) -> ModuleType:
    if name not in names:
        raise UsageError(f"unknown {role} format {name!r} (known: {', '.join(names)})")
    module = f"{__name__}.{name}"
    try:
        return import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or module.startswith(error.name):
            raise
        raise UsageError(
            f"{role} format {name!r} needs the Python package {error.name!r}: "
            f"pip install 'rayaug[{name}]'"
        ) from None


def check_name(name: str, role: str) -> str:
    """`name` if it names a format of `role` ("input", which also takes `auto`, or "output");
    else a ValueError listing the known names (the spec reports it by the field's path)."""
    names = (AUTO, *INPUTS) if role == "input" else OUTPUTS
    if name not in names:
        raise ValueError(f"unknown format {name!r}; use one of: {', '.join(names)}")
    return name


def scheme_refusal(name: str, uri: str) -> str | None:
    """Why output format `name` cannot write to `uri`, or None."""
    scheme = uri.partition("://")[0] if "://" in uri else "file"
    usable = OUTPUT_SCHEMES.get(name)
    if usable is None or scheme in usable:
        return None
    others = " or ".join(n for n in OUTPUTS if n not in OUTPUT_SCHEMES)
    where = ", ".join("local disk" if s == "file" else f"{s}://" for s in usable)
    why = NOT_WIRED.get((name, scheme))
    return (
        f"format {name} is not available on {scheme}:// yet ({where} only"
        f"{': ' + why if why else ''}); use format {others} there"
    )


def mix_refusal(name: str, who: str = "mix ops (mixup, cutmix, mosaic) pick") -> str | None:
    """Why mix ops cannot run on input `name` (`who` pick partners from all sources by
    position, which needs random access), or None. `auto` is judged once detected."""
    if name == AUTO or input_format(name).random_access:
        return None
    usable = " or ".join(n for n in INPUTS if input_format(n).random_access)
    return (
        f"{who} partners from all sources, which needs random access; {name} input is read "
        f"in sequence (use {usable} input)"
    )


def detect(declared: str, uri: str, paths: list[str]) -> str:
    """The input format to read: the declared one, or for `auto` the one that claims the listed
    files. Two formats' files at once are refused (one stray file must not change what is read)."""
    if declared != AUTO:
        return declared
    found = [n for n in INPUTS if any(input_format(n).claims(path) for path in paths)]
    if len(found) > 1:
        raise UsageError(f"input {uri} mixes {' and '.join(found)} files; set input.format")
    return found[0] if found else FALLBACK
