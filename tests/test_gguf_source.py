"""base_model.source gguf refuses a bad file in one line before anything is written: not a
GGUF, other bytes than the pinned SHA-256, a GGUF of another architecture. The GGUFs here
are written with the `gguf` package's own writer (llama.cpp's format), a few KB each; the
real one is dequantized by the small recipe's pipeline run (tests/test_small.py)."""

import hashlib
import sys

import numpy as np
import pytest

from stages.lib import gguf_source
from stages.lib.checkpoint import CheckpointError
from stages.lib.families import gemma3, llama3
from testkit.workspace import set_param, sh


def write_gguf(path, arch: str, vocabulary: int = 1000) -> str:
    """A GGUF with `arch`, a vocabulary array before it in the header order llama.cpp does not
    promise (so the reader must skip arrays), and one tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_string("general.name", "test")
    writer.add_token_list([f"t{i}" for i in range(vocabulary)])
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_reads_the_architecture_from_the_header(tmp_path):
    write_gguf(tmp_path / "m.gguf", "gemma3")
    assert gguf_source.architecture(str(tmp_path / "m.gguf")) == "gemma3"


@pytest.mark.parametrize(
    "content,message",
    [
        (b"PK\x03\x04 a zip, not a model", "not a GGUF file (it does not start with the bytes 'GGUF')"),
        (b"GGUF\x03\x00\x00\x00\x01", "a GGUF header that cannot be read"),
    ],
)
def test_refuses_what_is_not_a_gguf(tmp_path, content, message):
    (tmp_path / "m.gguf").write_bytes(content)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gguf_source.architecture(str(tmp_path / "m.gguf"))


def test_refuses_other_bytes_than_the_pin_and_another_architecture(tmp_path):
    digest = write_gguf(tmp_path / "m.gguf", "llama")
    pin = {"gguf_file": str(tmp_path / "m.gguf"), "gguf_package": None, "gguf_sha256": "0" * 64}
    with pytest.raises(CheckpointError, match=f"SHA-256 {digest} differs from base_model.gguf_sha256 0000"):
        gguf_source.check(str(tmp_path / "m.gguf"), pin, gemma3)
    with pytest.raises(CheckpointError, match="a GGUF of architecture 'llama', not Gemma 3 \\('gemma3'\\)"):
        gguf_source.check(str(tmp_path / "m.gguf"), {**pin, "gguf_sha256": digest}, gemma3)
    with pytest.raises(CheckpointError, match="gguf is not supported for Llama 3"):
        gguf_source.check(str(tmp_path / "m.gguf"), {**pin, "gguf_sha256": digest}, llama3)


def test_a_package_without_assemble_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="base_model.gguf_package: no module 'no_such_gguf_package' installed"):
        gguf_source.obtain({"gguf_file": None, "gguf_package": "no_such_gguf_package"}, str(tmp_path))
    with pytest.raises(CheckpointError, match="base_model.gguf_package: json has no assemble"):
        gguf_source.obtain({"gguf_file": None, "gguf_package": "json"}, str(tmp_path))


@pytest.mark.parametrize("case", ["not-gguf", "sha-mismatch", "other-architecture", "missing-file"])
def test_the_stage_stops_in_one_line_and_writes_nothing(workspace, case):
    root = workspace("bad-gguf")
    path = root / "model.gguf"
    if case == "not-gguf":
        path.write_bytes(b"<html>404</html>")
        digest, message = hashlib.sha256(path.read_bytes()).hexdigest(), "not a GGUF file"
    elif case == "sha-mismatch":
        digest, message = "f" * 64, "differs from base_model.gguf_sha256"
    elif case == "other-architecture":
        digest, message = None, "a GGUF of architecture 'llama', not Gemma 3"
    else:
        digest, message = "f" * 64, "base_model.gguf_file: model.gguf not found"
    if case in ("sha-mismatch", "other-architecture"):
        digest = digest or write_gguf(path, "llama")
        if case == "sha-mismatch":
            write_gguf(path, "gemma3")
    set_param(root, "base_model.source", "gguf")
    set_param(root, "base_model.tiny_seed", None)
    set_param(root, "base_model.gguf_file", "model.gguf")
    set_param(root, "base_model.gguf_sha256", digest)
    proc = sh([sys.executable, "-m", "stages.base_model"], root, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("base_model: error: ") and message in lines[0], proc.stderr
    left = list((root / "models").iterdir()) if (root / "models").exists() else []
    assert left == []  # no base-hf, no staging directory, no assembled GGUF
