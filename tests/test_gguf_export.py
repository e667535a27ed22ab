"""The GGUF export (stages/export_gguf.py, stages/lib/gguf_export.py): files that llama.cpp
itself (stages/lib/gguf_llama.py) reads back to what the HF export computes, renders the chat
template of and ends answers in as the export does; and broken files refused.

The broken files are real GGUF files written by the stage's writer, then damaged where a
converter goes wrong: two attention heads swapped, a norm stored as transformers holds it
(without llama.cpp's 1 + w), Llama's q/k rows not in llama.cpp's rotary order, a file cut
short; and, for each family's tiny model, the metadata faults only a reader of the whole file
sees (a RoPE scaling factor or base, the sliding window, the head dimensions, the end-of-turn
token). Each must fail the check under the loosest limits of any type (q8_0's)."""

import json
import shutil

import numpy as np
import pytest
import yaml
from test_families import assert_gguf_round_trip

from stages import export_gguf
from stages.lib import gguf_export, gguf_reading
from stages.shared import families
from stages.shared.errors import StageFailed
from testkit.workspace import REPO, set_param, sh

pytestmark = pytest.mark.slow
LIMITS = yaml.safe_load((REPO / "params.yaml").read_text())["gguf"]["check"]


class Export:
    """A tiny HF checkpoint as export_gguf sees models/sft-hf: its language model, tensors,
    fixed prompts, reference logits and end tokens."""

    def __init__(self, directory, model_name: str):
        import torch

        from stages.shared.prompts import fixed_prompts

        self.dir, self.model_name = str(directory), model_name
        self.model = families.language_model(self.dir, model_name, torch.float32)
        self.tensors = {k: v.numpy().copy() for k, v in self.model.state_dict().items()}
        _, self.prompts = fixed_prompts(self.dir)
        self.reference = export_gguf.next_token_logits(self.model, self.prompts)
        self.ends = export_gguf.expected_ends(self.dir, model_name)

    def write(self, path, kind: str = "f16") -> str:
        gguf_export.write(str(path), kind, self.tensors, self.model.config, self.dir, self.model_name, "test")
        return str(path)

    def check(self, path, limits=LIMITS["q8_0"]):
        return export_gguf.check(path, self.reference, self.prompts, limits, self.ends)


@pytest.fixture(scope="module")
def gemma(tiny_base):
    return Export(tiny_base, "gemma3-4b")


@pytest.fixture(scope="module")
def f16_file(gemma, tmp_path_factory) -> str:
    """A good f16 GGUF of the tiny Gemma 3, written once; each test damages its own copy."""
    return gemma.write(tmp_path_factory.mktemp("gguf") / "good.gguf")


@pytest.fixture
def copy_of_good(f16_file, tmp_path) -> str:
    path = str(tmp_path / "m.gguf")
    shutil.copyfile(f16_file, path)
    return path


def places_in(path: str) -> dict:
    """Where each tensor's data and each metadata value lie in a file (byte offset, dtype,
    shape), from one parse by gguf's own reader: a test then damages its copy at those bytes.
    (A parse walks Gemma 3's 262,144-word vocabulary: stages/lib/gguf_reading.py makes it 3x
    faster.)"""
    import gguf

    with gguf_reading.one_parse_per_file():
        reader = gguf.GGUFReader(path)

    def place(view) -> tuple[int, np.dtype, tuple]:  # a view of the file's map: its offset in the file
        return view.ctypes.data - reader.data.ctypes.data, view.dtype, view.shape

    found = {t.name: place(t.data) for t in reader.tensors}
    found.update({name: place(f.parts[f.data[0]]) for name, f in reader.fields.items() if len(f.data) == 1})
    return found


@pytest.fixture(scope="module")
def places(f16_file) -> dict:
    return places_in(f16_file)


def edit(path: str, where: tuple, change) -> None:
    """Changes one tensor's data or metadata value in the file, in place (the layout untouched)."""
    offset, dtype, shape = where
    data = np.memmap(path, dtype=dtype, mode="r+", offset=offset, shape=shape)
    change(data)
    data.flush()
    del data


def test_bf16_reads_back_within_its_limits(gemma, tmp_path):
    # (f16 and q8_0, the recipes' types, are checked by every pipeline run: tiny_run, the families.)
    figures, problems = gemma.check(gemma.write(tmp_path / "m.gguf", "bf16"), LIMITS["bf16"])
    assert problems == [], figures
    assert figures["kl_max"] <= LIMITS["bf16"]["max_kl"] / 10, figures  # well inside: the limit is no floor


def test_two_swapped_heads_are_refused(gemma, copy_of_good, places):
    path = copy_of_good
    head = gemma.model.config.head_dim

    def swap(data):  # GGUF holds the matrix as rows of the output dimension: heads are row blocks
        first = np.array(data[:head])
        data[:head] = data[head : 2 * head]
        data[head : 2 * head] = first

    edit(path, places["blk.0.attn_q.weight"], swap)
    figures, problems = gemma.check(path)
    assert any("KL" in p for p in problems), figures


def test_a_norm_stored_as_transformers_holds_it_is_refused(gemma, copy_of_good, places):
    path = copy_of_good

    def without_llama_cpp_offset(data):
        data[:] = data - 1  # w instead of 1 + w: what a converter that forgets Gemma's norm convention writes

    edit(path, places["blk.3.ffn_norm.weight"], without_llama_cpp_offset)
    figures, problems = gemma.check(path)
    assert any("KL" in p for p in problems), figures


def test_a_file_cut_short_is_refused_in_one_line(gemma, copy_of_good):
    path = copy_of_good
    with open(path, "r+b") as f:
        f.truncate(f.seek(0, 2) // 2)
    with pytest.raises(StageFailed, match=r"^the GGUF check failed: llama\.cpp cannot read .*m\.gguf \("):
        gemma.check(path)


def family_export(name: str, tmp_path_factory) -> Export:
    from stages.shared.families import gemma3, llama3, qwen3

    builders = {"gemma3-4b": gemma3, "llama3.1-8b": llama3, "qwen3-8b": qwen3}
    directory = tmp_path_factory.mktemp(name)
    builders[name].build_tiny(str(directory), seed=0)
    return Export(directory, name)


# Metadata a reader of the whole file uses and the export's own architecture does not read back:
# (family, key, the wrong value, what fails). Each family's tiny model, in the keys it has.
FAULTS = [
    ("gemma3-4b", "gemma3.rope.scaling.factor", 1.0, "KL"),  # the global layers' linear x8 dropped
    ("gemma3-4b", "gemma3.attention.sliding_window", 4096, "KL"),  # local layers attend past their window
    ("gemma3-4b", "gemma3.attention.key_length", 64, "cannot read"),  # head dimensions
    ("gemma3-4b", "tokenizer.ggml.eot_token_id", 107, "end of turn"),  # "\n", not <end_of_turn>
    ("llama3.1-8b", "llama.rope.freq_base", 10000.0, "KL"),  # RoPE: Llama 3.1's base is 500,000
    ("llama3.1-8b", "llama.attention.head_count_kv", 4, "cannot read"),
    ("llama3.1-8b", "tokenizer.ggml.eot_token_id", 128000, "end of turn"),  # <|begin_of_text|>
    ("qwen3-8b", "qwen3.rope.freq_base", 10000.0, "KL"),
    ("qwen3-8b", "qwen3.attention.key_length", 64, "cannot read"),
    ("qwen3-8b", "tokenizer.ggml.eot_token_id", 151644, "end of turn"),  # <|im_start|>
]


@pytest.fixture(scope="module")
def family_files(tmp_path_factory) -> dict:
    """Each family's tiny model, its good f16 GGUF, and where its metadata lies in it."""
    found = {}
    for name in dict.fromkeys(f[0] for f in FAULTS):
        export = family_export(name, tmp_path_factory)
        good = export.write(tmp_path_factory.mktemp(f"{name}-gguf") / "good.gguf")
        found[name] = (export, good, places_in(good))
    return found


@pytest.mark.parametrize("name, key, wrong, fails", FAULTS, ids=[f"{f[0]}-{f[1].split('.')[-1]}" for f in FAULTS])
def test_a_metadata_fault_only_a_whole_file_reader_sees_is_refused(family_files, tmp_path, name, key, wrong, fails):
    export, good, places = family_files[name]
    assert export.check(good, LIMITS["f16"])[1] == [], "the good file passes"
    path = str(tmp_path / "m.gguf")
    shutil.copyfile(good, path)

    def set_to(value):
        value[0] = wrong

    edit(path, places[key], set_to)
    if fails == "cannot read":
        with pytest.raises(StageFailed, match=r"llama\.cpp cannot read"):
            export.check(path, LIMITS["f16"])
        return
    figures, problems = export.check(path, LIMITS["f16"])  # (an f16 file: its own type's limits)
    assert any(fails in p for p in problems), (figures, problems)


def test_llama_q_k_rows_out_of_rotary_order_are_refused(tmp_path, monkeypatch):
    from stages.shared.families import llama3

    (tmp_path / "hf").mkdir()
    llama3.build_tiny(str(tmp_path / "hf"), seed=0)
    export = Export(tmp_path / "hf", "llama3.1-8b")
    _, problems = export.check(export.write(tmp_path / "right.gguf"))
    assert problems == []
    monkeypatch.setattr(llama3, "gguf_tensor", lambda name, value, config: value)  # transformers' order, as it is
    figures, problems = export.check(export.write(tmp_path / "wrong.gguf"))
    assert any("KL" in p for p in problems), figures


def test_the_tiny_run_writes_each_type_checked_with_a_modelfile(tiny_run):
    assert_gguf_round_trip(tiny_run.path)
    modelfile = (tiny_run.path / "models" / "gguf" / "Modelfile").read_text()
    assert 'PARAMETER stop "<end_of_turn>"' in modelfile and "<start_of_turn>model" in modelfile


def test_a_gguf_that_fails_its_check_fails_the_stage_and_leaves_nothing(clone_of_tiny_run):
    root = clone_of_tiny_run
    set_param(root, "gguf.types", ["q8_0"])
    set_param(root, "gguf.check.q8_0.max_kl", 1.0e-12)  # below q8_0's rounding: every honest file fails it
    proc = sh(["dvc", "repro", "export_gguf"], root, check=False)
    assert proc.returncode != 0
    said = [ln for ln in proc.stderr.splitlines() if ln.startswith("export_gguf: failed:")]
    assert len(said) == 1 and "the GGUF check failed (q8_0: max KL" in said[0], proc.stderr[-2000:]
    assert "nothing was written to models/gguf" in said[0]
    models = root / "models"
    assert not (models / "gguf").exists() and not list(models.glob(".gguf.tmp-*"))
    assert json.loads((root / "metrics" / "gguf_check.json").read_text())["gguf"]["q8_0"]["passed"] is False
