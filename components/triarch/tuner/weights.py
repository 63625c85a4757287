"""Parameters and weight bytes of a checkpoint as vLLM loads it (quantized linear layers at their width)."""

from __future__ import annotations

from dataclasses import dataclass

from triarch.tuner.arch import ModelArch, Task


@dataclass(frozen=True)
class ParameterCount:
    """Parameters by part of the network (whole model, unsharded)."""

    embedding: int
    attention: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    router: int
    norms: int
    lm_head: int
    towers: int = 0
    """Vision/audio encoders and projector (multimodal checkpoints)."""

    @property
    def total(self) -> int:
        return (self.embedding + self.attention + self.dense_mlp + self.routed_experts + self.shared_experts
                + self.router + self.norms + self.lm_head + self.towers)

    @property
    def linear(self) -> int:
        """Parameters in the decoder's linear layers: what weight quantization (GPTQ/AWQ/FP8/...) compresses."""
        return self.attention + self.dense_mlp + self.routed_experts + self.shared_experts


def _attention_params(a: ModelArch) -> tuple[int, int]:
    """(linear weights + biases, norm weights) of one attention block."""
    h = a.hidden_size
    if a.is_mla:
        kv_lora = a.kv_lora_rank or 0
        q_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank:
            q = h * a.q_lora_rank + a.q_lora_rank * a.num_attention_heads * q_head  # q_a_proj, q_b_proj
            norms = a.q_lora_rank  # q_a_layernorm
        else:
            q = h * a.num_attention_heads * q_head  # q_proj
            norms = 0
        kv_a = h * (kv_lora + a.qk_rope_head_dim)  # kv_a_proj_with_mqa
        kv_b = kv_lora * a.num_attention_heads * (a.qk_nope_head_dim + a.v_head_dim)  # kv_b_proj
        o = a.num_attention_heads * a.v_head_dim * h  # o_proj
        return q + kv_a + kv_b + o, norms + kv_lora  # + kv_a_layernorm
    q_out = a.num_attention_heads * a.head_dim
    kv_out = a.num_key_value_heads * a.head_dim
    linear = h * q_out + 2 * h * kv_out + q_out * h
    if a.attention_bias:
        linear += q_out + 2 * kv_out
    return linear, (2 * a.head_dim if a.qk_norm else 0)


def parameter_breakdown(arch: ModelArch, *, task: Task = "generate") -> ParameterCount:
    """Parameters of the checkpoint as vLLM loads it. ``task="embed"`` leaves out the LM head (vLLM's pooling
    adapter does not load it; tied embeddings change nothing)."""
    a = arch
    h = a.hidden_size
    attn_linear, attn_norms = _attention_params(a)
    dense_layers = a.num_hidden_layers - a.num_moe_layers
    # gate_proj, up_proj, down_proj; fc1 and fc2 (with biases) where the MLP is not gated (Phi-1/2)
    gated = a.model_type != "phi"
    mlp = 3 * h * a.intermediate_size if gated else 2 * h * a.intermediate_size + a.intermediate_size + h
    routed = a.num_moe_layers * a.num_experts * 3 * h * a.moe_intermediate_size
    shared = a.num_moe_layers * 3 * h * a.shared_expert_intermediate_size
    router = a.num_moe_layers * (a.num_experts * h + (h if a.shared_expert_gate else 0))
    norms = a.num_hidden_layers * (2 * h + attn_norms) + h  # input/post-attention norms per layer, final norm
    embedding = a.vocab_size * h
    lm_head = 0 if (a.tie_word_embeddings or task == "embed") else a.vocab_size * h
    return ParameterCount(
        embedding=embedding,
        attention=a.num_hidden_layers * attn_linear,
        dense_mlp=dense_layers * mlp,
        routed_experts=routed,
        shared_experts=shared,
        router=router,
        norms=norms,
        lm_head=lm_head,
        towers=a.tower_parameters,
    )


def count_parameters(arch: ModelArch, *, task: Task = "generate") -> int:
    """Total parameters (all experts counted)."""
    return parameter_breakdown(arch, task=task).total


def weight_bytes(arch: ModelArch, *, task: Task = "generate") -> int:
    """Bytes of weights as loaded: quantized linear layers at :attr:`ModelArch.quantized_bytes_per_weight` (but the
    parts the quantization config keeps, :attr:`ModelArch.quant_kept`), embeddings, LM head, norms, router and
    multimodal towers in the serving dtype (quantizers leave those alone)."""
    p = parameter_breakdown(arch, task=task)
    parts = {"attention": p.attention, "dense_mlp": p.dense_mlp, "shared_experts": p.shared_experts,
             "routed_experts": p.routed_experts}
    quantized = sum(n for part, n in parts.items() if part not in arch.quant_kept)
    rest = p.total - quantized
    return int(quantized * arch.quantized_bytes_per_weight + rest * arch.serving_dtype_bytes)
