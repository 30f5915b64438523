"""The architecture matrix: tiny random targets of Hugging Face families, each built from its transformers config
class, with the features it exercises; ``docs/guides/supported_targets.md`` carries the same table
(``supported_targets_table``, checked by tests/repo/test_supported_targets_doc.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

VOCAB = 64
MASK_ID = VOCAB - 1
STATUS = "passes: packed features = each document alone, 3 training steps, greedy = `generate` in every mode"
_SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=256)  # fmt: skip
_ROPE_HALF = {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}


@dataclass(frozen=True)
class Family:
    name: str  # the model type
    features: str  # what it exercises
    build: Callable[[], torch.nn.Module]  # config kwargs -> a random causal LM in eval mode


def _model(config_class: str, model_class: str, **kwargs) -> Callable[[], torch.nn.Module]:
    def build():
        import transformers

        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**kwargs)
        return getattr(transformers, model_class)(config).eval()

    return build


def _gemma3():
    from helpers.targets import make_tiny_gemma3

    torch.manual_seed(0)
    return make_tiny_gemma3(vocab_size=VOCAB, num_layers=3, sliding_window=8)


def _qwen3_next():
    from helpers.targets import make_tiny_qwen3_next

    return make_tiny_qwen3_next()


_HYBRID = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
               num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
               linear_key_head_dim=8, linear_value_head_dim=8)  # fmt: skip
_SLIDING_GEMMA = dict(head_dim=8, num_key_value_heads=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"])  # fmt: skip

# fmt: off
FAMILIES = [
    Family("llama", "untied LM head, grouped-query attention",
           _model("LlamaConfig", "LlamaForCausalLM", **_SMALL, num_key_value_heads=2, tie_word_embeddings=False)),
    Family("qwen2", "q/k/v biases", _model("Qwen2Config", "Qwen2ForCausalLM", **_SMALL, num_key_value_heads=2)),
    Family("qwen3", "q/k norms, untied LM head",
           _model("Qwen3Config", "Qwen3ForCausalLM", **_SMALL, num_key_value_heads=2, head_dim=8,
                  tie_word_embeddings=False)),
    Family("qwen3 (tied)", "q/k norms, tied LM head",
           _model("Qwen3Config", "Qwen3ForCausalLM", **_SMALL, num_key_value_heads=2, head_dim=8,
                  tie_word_embeddings=True)),
    Family("qwen3_moe", "mixture-of-experts MLPs (4 experts, top 2)",
           _model("Qwen3MoeConfig", "Qwen3MoeForCausalLM", **_SMALL, num_key_value_heads=2, head_dim=8, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=16)),
    Family("mistral", "sliding-window attention (window 8, crossed by every decode)",
           _model("MistralConfig", "MistralForCausalLM", **_SMALL, num_key_value_heads=2, sliding_window=8)),
    Family("phi3", "fused qkv and gate/up projections, partial rotary (50%)",
           _model("Phi3Config", "Phi3ForCausalLM", **_SMALL, num_key_value_heads=2, rope_parameters=_ROPE_HALF,
                  pad_token_id=0)),
    Family("gpt_neox", "parallel residual, partial rotary (25%), attention biases",
           _model("GPTNeoXConfig", "GPTNeoXForCausalLM", **_SMALL, use_parallel_residual=True,
                  rope_parameters={**_ROPE_HALF, "partial_rotary_factor": 0.25})),
    Family("gpt2", "absolute position embeddings, tied LM head",
           _model("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=256)),
    Family("olmo2", "q/k norms over all heads, post-norm blocks",
           _model("Olmo2Config", "Olmo2ForCausalLM", **_SMALL, num_key_value_heads=2)),
    Family("granite", "embedding, residual, attention and logit multipliers",
           _model("GraniteConfig", "GraniteForCausalLM", **_SMALL, num_key_value_heads=2, embedding_multiplier=4.0,
                  residual_multiplier=0.5, attention_multiplier=0.25, logits_scaling=2.0)),
    Family("gemma2", "sliding window 8 + full layers, attention and final logit soft-caps, scaled embeddings",
           _model("Gemma2Config", "Gemma2ForCausalLM", **_SMALL, **_SLIDING_GEMMA, query_pre_attn_scalar=8,
                  attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    Family("gemma3_text", "sliding window 8 + full layers, two rotary bases, scaled embeddings, tied head", _gemma3),
    Family("qwen3_next", "hybrid: Gated DeltaNet linear attention + gated full attention, MoE; recurrent-state rollback, packed documents run one at a time", _qwen3_next),
    Family("qwen3_5_text", "hybrid (Qwen3.5): Gated DeltaNet linear attention + full attention, dense MLPs; as qwen3_next",
           _model("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", **_HYBRID,
                  layer_types=["linear_attention", "full_attention"] * 2)),
    Family("qwen3_5_moe_text", "hybrid (Qwen3.5 MoE): Gated DeltaNet linear attention + full attention, MoE; as qwen3_next",
           _model("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", **_HYBRID, num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=16, shared_expert_intermediate_size=16,
                  layer_types=["linear_attention", "full_attention"] * 2)),
]
# fmt: on


def supported_targets_table() -> list[str]:
    """The markdown table of the matrix, one row per family (the guide's table must equal it)."""
    rows = ["| family | features exercised | status |", "|---|---|---|"]
    return rows + [f"| `{family.name}` | {family.features} | {STATUS} |" for family in FAMILIES]
