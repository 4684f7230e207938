"""rayaug.formats: the registry of input and output formats, found by name.

Each format's reading and writing is tested with its stage (tests/test_sources.py,
tests/test_sinks.py, tests/test_lance.py); here: names, the mix rule, a missing package.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from rayaug import formats
from rayaug.errors import UsageError


def test_every_registered_name_finds_its_format() -> None:
    for name in formats.INPUTS:
        assert formats.input_format(name).name == name
    for name in formats.OUTPUTS:
        assert formats.output_format(name).name == name
    with pytest.raises(UsageError, match="unknown output format 'zarr'"):
        formats.output_format("zarr")


def test_the_mix_rule_is_asked_of_the_format() -> None:
    assert formats.mix_refusal("parquet") is None and formats.mix_refusal("folder") is None
    assert formats.mix_refusal("auto") is None  # judged once the input is listed
    refusal = formats.mix_refusal("webdataset")
    assert "needs random access" in refusal and "use parquet or folder input" in refusal


def test_auto_detects_the_format_that_claims_the_files() -> None:
    assert formats.detect("auto", "in", ["a/1.jpg", "b/2.png"]) == "folder"
    assert formats.detect("auto", "in", ["x.parquet", "notes.md"]) == "parquet"
    assert formats.detect("auto", "in", ["notes.md"]) == formats.FALLBACK
    assert formats.detect("webdataset", "in", ["a/1.jpg"]) == "webdataset"
    with pytest.raises(UsageError, match="mixes parquet and folder files"):
        formats.detect("auto", "in", ["x.parquet", "a/1.jpg"])


def test_a_format_without_its_package_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "rayaug.formats.lance", raising=False)
    monkeypatch.setitem(sys.modules, "lance", None)  # `import lance` fails as if absent
    with pytest.raises(UsageError, match=r"needs the Python package 'lance': .*rayaug\[lance\]"):
        formats.output_format("lance")


def test_no_format_name_is_compared_outside_the_formats() -> None:
    names = "|".join(sorted({*formats.INPUTS, *formats.OUTPUTS}))
    compared = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({names})["']""")
    root = Path(formats.__file__).parent.parent
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in root.rglob("*.py")
        if path.parent.name != "formats"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if compared.search(line)
    ]
    assert found == []
