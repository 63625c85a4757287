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


def _bytes(arch: ModelArch, p: ParameterCount) -> int:
    """Bytes of these parameters as loaded: quantized linear layers at :attr:`ModelArch.quantized_bytes_per_weight`
    (but the parts the quantization config keeps, :attr:`ModelArch.quant_kept`), embeddings, LM head, norms, router
    and multimodal towers in the serving dtype (quantizers leave those alone)."""
    parts = {"attention": p.attention, "dense_mlp": p.dense_mlp, "shared_experts": p.shared_experts,
             "routed_experts": p.routed_experts}
    quantized = sum(n for part, n in parts.items() if part not in arch.quant_kept)
    rest = p.total - quantized
    return int(quantized * arch.quantized_bytes_per_weight + rest * arch.serving_dtype_bytes)


def weight_bytes(arch: ModelArch, *, task: Task = "generate") -> int:
    """Bytes of the whole model's weights as loaded (see :func:`_bytes`)."""
    return _bytes(arch, parameter_breakdown(arch, task=task))


def pipeline_stages(num_layers: int, stages: int) -> list[range]:
    """The decoder layers of each pipeline stage as vLLM splits them by default (vllm/distributed/utils.py
    ``get_pp_indices``, without VLLM_PP_LAYER_PARTITION): equal shares, the remainder one layer each to the stages
    just before the last (so the first stage, which also holds the embedding, gets one when the remainder reaches
    it)."""
    sizes = [num_layers // stages] * stages
    for i in range(2, num_layers % stages + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(stages)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def stage_weight_bytes(arch: ModelArch, stages: int, *, task: Task = "generate") -> list[int]:
    """Bytes of weights each pipeline stage loads (whole stage, before tensor parallelism): its decoder layers (an
    MoE layer's experts and router, or a dense layer's MLP), the embedding and the towers on the first stage, the
    final norm and the LM head on the last (the embedding's matrix again where the two are tied: the last stage
    needs it to compute logits)."""
    p = parameter_breakdown(arch, task=task)
    layers = arch.num_hidden_layers
    moe = set(arch.moe_layer_indices)
    dense_layers = layers - arch.num_moe_layers
    final_norm = arch.hidden_size
    per_layer_norms = (p.norms - final_norm) / layers
    head = p.lm_head or (p.embedding if task == "generate" and stages > 1 else 0)
    out = []
    for index, span in enumerate(pipeline_stages(layers, stages)):
        n_moe = sum(1 for i in span if i in moe)
        n_dense = len(span) - n_moe
        first, last = index == 0, index == stages - 1
        share = ParameterCount(
            embedding=p.embedding if first else 0,
            attention=p.attention * len(span) // layers,
            dense_mlp=p.dense_mlp * n_dense // dense_layers if dense_layers else 0,
            routed_experts=p.routed_experts * n_moe // arch.num_moe_layers if arch.num_moe_layers else 0,
            shared_experts=p.shared_experts * n_moe // arch.num_moe_layers if arch.num_moe_layers else 0,
            router=p.router * n_moe // arch.num_moe_layers if arch.num_moe_layers else 0,
            norms=int(per_layer_norms * len(span)) + (final_norm if last else 0),
            lm_head=head if last else 0,
            towers=p.towers if first else 0,
        )
        out.append(_bytes(arch, share))
    return out
