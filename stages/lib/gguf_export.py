"""The tuned model as a llama.cpp GGUF file: what llama.cpp, Ollama and LM Studio run.

Written with ggml-org's own `gguf` package (its GGUFWriter, its tensor-name maps, its
quantizers), from the checked HF export's language model, the way llama.cpp's own
convert_hf_to_gguf.py writes the family: the same metadata keys, the same tensor names, the
same changes to tensors where llama.cpp computes differently from transformers (each family's
`gguf_tensor`: Gemma's norms stored as 1 + w, Llama's q/k rows in llama.cpp's rotary order),
the tokenizer as llama.cpp reads it (SentencePiece pieces with their scores and types for
Gemma 3; byte-level BPE tokens, merges and the pre-tokenizer's name for Llama 3 and Qwen 3),
the chat template and the special tokens, end of turn included.

Types (`export_gguf.types`): f16 and bf16 (every matrix in that float type), q8_0 (8-bit
blocks of 32 with one scale each, ~1.06 bytes a weight). Vectors (norms) stay float32, as
llama.cpp keeps them; a matrix whose rows are not whole blocks of 32 stays f16 in a q8_0 file,
as llama.cpp's converter does. Q4_K_M is not offered: the `gguf` package quantizes no
k-quant (it only reads them); llama.cpp's `llama-quantize model-F16.gguf Q4_K_M` makes one
from the f16 file. A multimodal checkpoint's vision tower is not written: llama.cpp keeps it
in a separate projector file (mmproj), and text fine-tuning never changed it.
"""

import os
from dataclasses import dataclass

import numpy as np

from stages.shared import families

TYPES = ("f16", "bf16", "q8_0")


@dataclass(frozen=True)
class Vocabulary:
    model: str  # tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    pre: str | None  # tokenizer.ggml.pre: which pre-tokenizer llama.cpp applies (BPE)
    pieces: list[bytes]
    scores: list[float] | None
    types: list[int]  # gguf.TokenType


def _added_tokens(tokenizer_dir: str) -> list[tuple[int, str, bool]]:
    """(id, text, special) of the tokenizer's added tokens: tokenizer_config.json's
    added_tokens_decoder where it has one, else tokenizer.json's added_tokens."""
    import json

    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        decoder = json.load(f).get("added_tokens_decoder")
    if decoder:
        return [(int(i), t["content"], bool(t.get("special"))) for i, t in decoder.items()]
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        return [(t["id"], t["content"], bool(t.get("special"))) for t in json.load(f).get("added_tokens", [])]


def _looks_special(text: str) -> bool:
    """llama.cpp's `does_token_look_special`: tokens that act as control tokens though a
    tokenizer does not mark them special (Gemma's <unusedN>, <|...|>)."""
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def vocabulary(tokenizer_dir: str, kind: tuple[str, str | None], n_vocab: int, control: tuple = ()) -> Vocabulary:
    """The tokenizer as llama.cpp's converter writes it, padded with unused [PADn] pieces to the
    embedding's rows (Gemma 3 4B's 262,208 rows hold 262,144 tokens; Qwen 3's 151,936 hold
    151,669)."""
    import json
    from pathlib import Path

    import gguf

    model, pre = kind
    if model == "llama":
        spm = gguf.SentencePieceVocab(Path(tokenizer_dir))
        pieces, scores, types = (list(x) for x in zip(*spm.all_tokens(), strict=True))
        types = [int(t) for t in types]
        for i, text, special in _added_tokens(tokenizer_dir):  # as llama.cpp's converter marks them
            if i >= len(pieces):
                continue
            if special or _looks_special(text) or text in control:
                types[i] = int(gguf.TokenType.CONTROL)
            else:
                text = text.replace("\u2581", " ")  # SentencePiece's space, as llama.cpp pre-normalizes it
                types[i] = int(gguf.TokenType.USER_DEFINED)
            pieces[i], scores[i] = text.encode("utf-8"), -1000.0
    else:
        with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
            spec = json.load(f)
        by_id = {i: (t, None) for t, i in spec["model"]["vocab"].items()}
        by_id.update({a["id"]: (a["content"], a["special"]) for a in spec.get("added_tokens", [])})
        pieces, scores, types = [], None, []
        for i in range(max(by_id) + 1):
            text, special = by_id.get(i, (f"[PAD{i}]", None))
            pieces.append(text.encode("utf-8"))
            kind_of = gguf.TokenType.UNUSED if i not in by_id else gguf.TokenType.NORMAL
            if special is not None:
                kind_of = gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED
            types.append(int(kind_of))
    if len(pieces) > n_vocab:
        raise ValueError(f"the tokenizer has {len(pieces)} tokens, more than the embedding's {n_vocab} rows")
    for i in range(len(pieces), n_vocab):
        pieces.append(f"[PAD{i}]".encode())
        types.append(int(gguf.TokenType.UNUSED))
        if scores is not None:
            scores.append(-1000.0)
    return Vocabulary(model, pre, pieces, scores, types)


@dataclass(frozen=True)
class Written:
    path: str
    bytes: int
    tensors: int


def file_name(stem: str, kind: str) -> str:
    """llama.cpp's naming: model-Q8_0.gguf."""
    return f"{stem}-{kind.upper()}.gguf"


def _tensor_type(kind: str, array: np.ndarray):
    import gguf

    if array.ndim == 1:
        return gguf.GGMLQuantizationType.F32
    if kind == "q8_0":
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
        return gguf.GGMLQuantizationType.Q8_0 if array.shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16
    return {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16}[kind]


def _encoded(array: np.ndarray, qtype):
    import gguf

    if qtype == gguf.GGMLQuantizationType.F32:
        return array.astype(np.float32), None
    if qtype == gguf.GGMLQuantizationType.F16:
        return array.astype(np.float16), None
    return gguf.quants.quantize(array.astype(np.float32), qtype), qtype


FILE_TYPES = {"f16": 1, "bf16": 32, "q8_0": 7}  # llama.cpp's LlamaFileType (general.file_type)


def write(
    out_path: str,
    kind: str,
    tensors: dict[str, np.ndarray],
    text_config,
    tokenizer_dir: str,
    model_name: str,
    name: str,
) -> Written:
    """Writes one GGUF of type `kind`: `tensors` are the language model's, by transformers'
    names, float32; `text_config` its (text) config; `tokenizer_dir` holds the export's
    tokenizer files."""
    import gguf

    family = families.of(model_name)
    arch = family.GGUF_ARCHITECTURE
    c = text_config
    writer = gguf.GGUFWriter(out_path, arch)
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[kind])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    tokens = vocabulary(tokenizer_dir, family.GGUF_TOKENIZER, c.vocab_size, getattr(family, "GGUF_CONTROL", ()))
    writer.add_tokenizer_model(tokens.model)
    if tokens.pre:
        writer.add_tokenizer_pre(tokens.pre)
    writer.add_token_list(tokens.pieces)
    if tokens.scores is not None:
        writer.add_token_scores(tokens.scores)
    writer.add_token_types(tokens.types)
    gguf.SpecialVocab(tokenizer_dir, load_merges=tokens.model == "gpt2", n_vocab=len(tokens.pieces)).add_to_gguf(
        writer, quiet=True
    )
    writer.add_eot_token_id(tokens.pieces.index(family.END_OF_TURN.encode()))
    end_of_message = getattr(family, "END_OF_MESSAGE", "").encode()
    if end_of_message and end_of_message in tokens.pieces:  # llama.cpp ends an answer there too
        writer.add_eom_token_id(tokens.pieces.index(end_of_message))
    extra = family.gguf_metadata(writer, c)  # the family's own keys, and tensors llama.cpp computes from config

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], c.num_hidden_layers)
    count = 0
    for hf_name, array in {**tensors, **extra}.items():
        if hf_name == "lm_head.weight" and getattr(c, "tie_word_embeddings", False):
            continue  # tied: llama.cpp reads the output head from token_embd when the file has no output.weight
        if hf_name in extra:
            gguf_name = hf_name
        else:
            gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
            if gguf_name is None:
                raise ValueError(f"{hf_name}: no GGUF name for it in gguf's {arch} map")
            array = family.gguf_tensor(hf_name, array, c)
        data, raw = _encoded(
            array, _tensor_type(kind, array) if hf_name not in extra else gguf.GGMLQuantizationType.F32
        )
        writer.add_tensor(gguf_name, data, raw_dtype=raw)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Written(out_path, os.path.getsize(out_path), count)
