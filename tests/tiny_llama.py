"""A tiny Llama checkpoint in Hugging Face's format, made with numpy and safetensors alone (no torch):
``config.json`` as transformers writes one for ``LlamaForCausalLM`` and the weights under its
names, so ``AutoModelForCausalLM.from_pretrained`` loads it. For tests that put a model where
Hugging Face's tools look."""
from __future__ import annotations

import json

import numpy as np


def tiny_llama_files(vocab: int = 64, hidden: int = 16, layers: int = 1, seed: int = 0) -> dict[str, bytes]:
    """{path: bytes} of a published checkpoint: config.json and model.safetensors (float32)."""
    from safetensors.numpy import save

    heads, kv_heads, ff = 2, 1, 2 * hidden
    head_dim = hidden // heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
              "hidden_size": hidden, "intermediate_size": ff, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": 64,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
              "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32"}
    rng = np.random.default_rng(seed)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        shapes |= {f"{attn}.q_proj.weight": (heads * head_dim, hidden), f"{attn}.k_proj.weight": (kv_heads * head_dim, hidden),
                   f"{attn}.v_proj.weight": (kv_heads * head_dim, hidden), f"{attn}.o_proj.weight": (hidden, heads * head_dim),
                   f"{mlp}.gate_proj.weight": (ff, hidden), f"{mlp}.up_proj.weight": (ff, hidden),
                   f"{mlp}.down_proj.weight": (hidden, ff), f"model.layers.{i}.input_layernorm.weight": (hidden,),
                   f"model.layers.{i}.post_attention_layernorm.weight": (hidden,)}
    weights = {name: (np.ones(shape) if len(shape) == 1 else rng.normal(0, 0.2, shape)).astype(np.float32)
               for name, shape in shapes.items()}
    return {"config.json": json.dumps(config, indent=1).encode(),
            "model.safetensors": save(weights, metadata={"format": "pt"})}
