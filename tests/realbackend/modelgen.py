"""Tiny random Llama models for real inference servers, made offline and cached on disk.

Nothing is downloaded: a byte-level BPE tokenizer is trained with ``tokenizers``
on generated text, and the weights are random f32. Two formats from one spec:

* GGUF for llama.cpp's server (``write_gguf``, needs ``gguf`` and ``numpy``);
* a Hugging Face folder for vLLM (``write_hf``: ``config.json``, ``tokenizer.json``,
  ``model.safetensors``; needs ``safetensors`` and ``numpy``, both in vLLM's env).

The output rows of the special tokens and of the lone non-ASCII bytes are zero,
so greedy decoding never ends a stream early (the end-of-turn token never wins)
and every generated token carries text (no half UTF-8 characters held back):
one token, one content chunk.

Run ``python -m tests.realbackend.modelgen gguf|hf`` to build and print the path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"
_GENERATOR_VERSION = 1  # bump when the files change for the same spec


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of the random model and of its tokenizer's training text."""

    hidden: int = 512
    """Embedding width."""
    layers: int = 8
    """Transformer blocks."""
    heads: int = 8
    """Attention heads (head size ``hidden / heads``)."""
    kv_heads: int = 8
    """Key/value heads."""
    ffn: int = 1408
    """Feed-forward width."""
    vocab: int = 8000
    """Vocabulary size, special tokens included."""
    context: int = 8192
    """Trained context length the model claims."""
    seed: int = 1234
    """Seed of the text, the tokenizer training and the weights."""
    corpus_words: int = 200_000
    """Words of generated text the tokenizer is trained on."""

    def key(self) -> str:
        """Short hash of the spec and generator version: the cache folder's name."""
        raw = json.dumps({"v": _GENERATOR_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


def cache_root() -> Path:
    """``$TOKENSTAMP_TEST_MODELS`` or ``~/.cache/tokenstamp-test-models``."""
    env = os.environ.get("TOKENSTAMP_TEST_MODELS")
    return Path(env) if env else Path.home() / ".cache" / "tokenstamp-test-models"


class WordSource:
    """Random pseudo-words (ASCII): the tokenizer's corpus and the tests' prompts."""

    def __init__(self, seed: int | str) -> None:
        self._rng = random.Random(seed)
        syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
        syllables += [c + v + e for c in _CONSONANTS for v in _VOWELS for e in "nrst"]
        self._syllables = syllables

    def word(self) -> str:
        """One word of 1-4 syllables."""
        rng = self._rng
        return "".join(rng.choice(self._syllables) for _ in range(rng.choice((1, 2, 2, 3, 4))))

    def text(self, words: int) -> str:
        """``words`` words as sentences."""
        rng = self._rng
        out: list[str] = []
        sentence = 0
        for _ in range(words):
            w = self.word()
            if sentence == 0:
                w = w.capitalize()
            sentence += 1
            if sentence > rng.randint(6, 14):
                w += rng.choice(".!?.")
                sentence = 0
            elif rng.random() < 0.08:
                w += ","
            out.append(w)
        return " ".join(out)


def train_tokenizer(spec: ModelSpec) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` with the ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    source = WordSource(spec.seed)
    lines = [source.text(50) for _ in range(spec.corpus_words // 50)]
    tok.train_from_iterator(lines, trainer)
    return tok


def _vocab_in_order(tok: Any) -> list[str]:
    vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocab)
    for text, idx in vocab.items():
        tokens[idx] = text
    if "" in tokens:
        raise RuntimeError("tokenizer ids are not contiguous")
    return tokens


def _silent_ids(tok: Any, tokens: list[str]) -> list[int]:
    """Ids the model must never emit: special tokens and bytes that are no text alone."""
    out = []
    for idx, token in enumerate(tokens):
        if token in SPECIAL_TOKENS:
            out.append(idx)
            continue
        text = tok.decode([idx])
        if not text or "\ufffd" in text or not text.isascii():
            out.append(idx)
    return out


def _weights(spec: ModelSpec, silent: list[int]) -> dict[str, Any]:
    """Random f32 weights, Hugging Face names and ``[out, in]`` shapes."""
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    head = spec.hidden // spec.heads
    f32 = np.float32

    def rand(*shape: int) -> Any:
        return (rng.standard_normal(shape, dtype=f32) * 0.02).astype(f32)

    out = rand(spec.vocab, spec.hidden)
    out[silent] = 0.0
    w: dict[str, Any] = {
        "model.embed_tokens.weight": rand(spec.vocab, spec.hidden),
        "model.norm.weight": np.ones(spec.hidden, dtype=f32),
        "lm_head.weight": out,
    }
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(spec.hidden, dtype=f32)
        w[p + "post_attention_layernorm.weight"] = np.ones(spec.hidden, dtype=f32)
        w[p + "self_attn.q_proj.weight"] = rand(spec.heads * head, spec.hidden)
        w[p + "self_attn.k_proj.weight"] = rand(spec.kv_heads * head, spec.hidden)
        w[p + "self_attn.v_proj.weight"] = rand(spec.kv_heads * head, spec.hidden)
        w[p + "self_attn.o_proj.weight"] = rand(spec.hidden, spec.heads * head)
        w[p + "mlp.gate_proj.weight"] = rand(spec.ffn, spec.hidden)
        w[p + "mlp.up_proj.weight"] = rand(spec.ffn, spec.hidden)
        w[p + "mlp.down_proj.weight"] = rand(spec.hidden, spec.ffn)
    return w


_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(hf: str) -> str:
    if hf in _GGUF_NAMES:
        return _GGUF_NAMES[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{_GGUF_NAMES[rest]}"


def _merges(tok: Any) -> list[str]:
    model = json.loads(tok.to_str())["model"]
    return [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]


def _publish(tmp: Path, final: Path) -> Path:
    """Atomically move a finished file or folder into the cache (another run may race)."""
    try:
        tmp.rename(final)
    except OSError:
        if not final.exists():
            raise
    return final


def write_gguf(spec: ModelSpec | None = None, root: Path | None = None) -> Path:
    """The GGUF file for ``spec`` in the cache, written once."""
    import gguf

    spec = spec or ModelSpec()
    folder = (root or cache_root()) / spec.key()
    final = folder / "model.gguf"
    if final.exists():
        return final
    folder.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(spec)
    tokens = _vocab_in_order(tok)
    silent = _silent_ids(tok, tokens)
    ids = {t: i for i, t in enumerate(tokens)}
    tmp = folder / f"model.gguf.{os.getpid()}.tmp"
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("tokenstamp-test-random-llama")
    writer.add_context_length(spec.context)
    writer.add_embedding_length(spec.hidden)
    writer.add_block_count(spec.layers)
    writer.add_feed_forward_length(spec.ffn)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_rope_dimension_count(spec.hidden // spec.heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(spec.vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    control = {ids[t] for t in SPECIAL_TOKENS}
    writer.add_token_types(
        [
            gguf.TokenType.CONTROL if i in control else gguf.TokenType.NORMAL
            for i in range(len(tokens))
        ]
    )
    writer.add_token_merges(_merges(tok))
    writer.add_bos_token_id(ids["<|endoftext|>"])
    writer.add_eos_token_id(ids["<|im_end|>"])
    writer.add_pad_token_id(ids["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    for name, array in _weights(spec, silent).items():
        writer.add_tensor(_gguf_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (folder / "tokenizer.json").write_text(tok.to_str())
    return _publish(tmp, final)


def write_hf(spec: ModelSpec | None = None, root: Path | None = None) -> Path:
    """The Hugging Face model folder for ``spec`` in the cache, written once."""
    from safetensors.numpy import save_file  # type: ignore[import-not-found,unused-ignore]

    spec = spec or ModelSpec()
    parent = (root or cache_root()) / spec.key()
    final = parent / "hf"
    if (final / "model.safetensors").exists():
        return final
    tmp = parent / f"hf.{os.getpid()}.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(spec)
    tokens = _vocab_in_order(tok)
    silent = _silent_ids(tok, tokens)
    ids = {t: i for i, t in enumerate(tokens)}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.hidden // spec.heads,
        "vocab_size": spec.vocab,
        "max_position_embeddings": spec.context,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    (tmp / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]})
    )
    (tmp / "tokenizer.json").write_text(tok.to_str())
    (tmp / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "add_bos_token": False,
                "model_max_length": spec.context,
                "chat_template": CHATML_TEMPLATE,
            },
            indent=1,
        )
    )
    save_file(_weights(spec, silent), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    return _publish(tmp, final)


def main(argv: list[str] | None = None) -> int:
    """CLI: build one format and print its path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("format", choices=("gguf", "hf"))
    args = parser.parse_args(argv)
    path = write_gguf() if args.format == "gguf" else write_hf()
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
