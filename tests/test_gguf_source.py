"""base_model.source gguf refuses a bad file in one line before anything is written: not a
GGUF, other bytes than the pinned SHA-256, a GGUF of another architecture, one whose header
reads well but whose tensor data is cut off or damaged (pinned as it is, as a user pins the
file they have). The GGUFs here are written with the `gguf` package's own writer (llama.cpp's
format), a few KB each (`tiny_gemma3_gguf`: one transformers dequantizes); the real one is
dequantized by the small recipe's pipeline run (tests/test_small.py)."""

import hashlib
import sys

import numpy as np
import pytest

from stages.lib import gguf_source
from stages.shared.checkpoint import CheckpointError
from stages.shared.families import gemma3, llama3
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


def tiny_gemma3_gguf(path, damaged: bool = False) -> str:
    """A complete Gemma 3 GGUF of one layer, hidden 16, float32, which transformers loads (and
    dequantizes) in seconds; `damaged`: one norm weight is NaN, as flipped bytes can make it."""
    import gguf

    hidden, ffn, heads, head_dim, vocabulary = 16, 32, 2, 8, 64
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(1)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(1)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(8)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(vocabulary)])
    w.add_token_scores([0.0] * vocabulary)
    w.add_token_types([1] * vocabulary)
    rng = np.random.default_rng(0)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    norm = weight(hidden)
    if damaged:
        norm[3] = np.nan
    shapes = {
        "token_embd.weight": (vocabulary, hidden),
        "output_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (heads * head_dim, hidden),
        "blk.0.attn_k.weight": (head_dim, hidden),
        "blk.0.attn_v.weight": (head_dim, hidden),
        "blk.0.attn_output.weight": (hidden, heads * head_dim),
        "blk.0.attn_q_norm.weight": (head_dim,),
        "blk.0.attn_k_norm.weight": (head_dim,),
        "blk.0.post_attention_norm.weight": (hidden,),
        "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.post_ffw_norm.weight": (hidden,),
        "blk.0.ffn_gate.weight": (ffn, hidden),
        "blk.0.ffn_up.weight": (ffn, hidden),
        "blk.0.ffn_down.weight": (hidden, ffn),
    }
    w.add_tensor("blk.0.attn_norm.weight", norm)
    for name, shape in shapes.items():
        w.add_tensor(name, weight(*shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pin(path, digest: str) -> dict:
    return {"gguf_file": str(path), "gguf_package": None, "gguf_sha256": digest}


def test_a_gguf_cut_off_in_its_tensor_data_is_refused_by_its_header(tmp_path):
    """The header reads well; a tensor it lists ends past the file's end: one line, before
    transformers (whose reader fails with a numpy reshape traceback) is started."""
    whole = tmp_path / "m.gguf"
    tiny_gemma3_gguf(whole)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-100])
    digest = hashlib.sha256(cut.read_bytes()).hexdigest()
    gguf_source.check(str(whole), pin(whole, hashlib.sha256(whole.read_bytes()).hexdigest()), gemma3)
    with pytest.raises(CheckpointError, match=r"cut off or damaged: tensor blk\.0\.ffn_down\.weight needs bytes up to"):
        gguf_source.check(str(cut), pin(cut, digest), gemma3)


def test_a_gguf_whose_data_is_damaged_is_refused_once_dequantized(tmp_path):
    path = tmp_path / "m.gguf"
    tiny_gemma3_gguf(path, damaged=True)
    gguf_source.check(str(path), pin(path, hashlib.sha256(path.read_bytes()).hexdigest()), gemma3)  # the header is fine
    with pytest.raises(CheckpointError, match=r"damaged: tensor model\.layers\.0\.input_layernorm\.weight holds NaN"):
        gguf_source.dequantize(str(path), str(tmp_path / "out"), gemma3)


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


@pytest.mark.parametrize("case", ["not-gguf", "sha-mismatch", "other-architecture", "missing-file", "cut-off"])
def test_the_stage_stops_in_one_line_and_writes_nothing(workspace, case):
    root = workspace("bad-gguf")
    path = root / "model.gguf"
    if case == "cut-off":
        tiny_gemma3_gguf(path)
        path.write_bytes(path.read_bytes()[:-100])
        digest, message = hashlib.sha256(path.read_bytes()).hexdigest(), "cut off or damaged: tensor"
    elif case == "not-gguf":
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
