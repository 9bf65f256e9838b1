"""A Llama causal LM in plain JAX that reads Hugging Face's checkpoints as published (Llama 3.x:
sharded safetensors with model.safetensors.index.json, bf16 weights, rope_scaling "llama3",
head_dim derived when absent, tied embeddings): the fine-tuning cells and the server import it."""
import json, math, os

import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors import safe_open

COLUMNS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")   # split by output rows on the "model" axis
ROWS = ("o_proj", "down_proj")                                      # split by input columns


def module(layer, name):
    """Hugging Face's name of a layer's linear module, e.g. model.layers.0.self_attn.q_proj."""
    block = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return f"model.layers.{layer}.{block}.{name}"


def spec(name):
    """How a weight ([out, in], as Hugging Face stores it) is split over the mesh's "model" axis."""
    if name.endswith(tuple(f"{n}.weight" for n in COLUMNS)) or name in ("model.embed_tokens.weight", "lm_head.weight"):
        return P("model", None)
    if name.endswith(tuple(f"{n}.weight" for n in ROWS)):
        return P(None, "model")
    return P()   # norms: whole on every device


def shards(folder):
    """{tensor name: the file holding it}: model.safetensors.index.json's weight_map when the
    checkpoint is sharded (every model above a few GB is), else the one model.safetensors."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        return json.load(open(index))["weight_map"]
    with safe_open(os.path.join(folder, "model.safetensors"), "numpy") as f:
        return {name: "model.safetensors" for name in f.keys()}


def load(folder, mesh=None, dtype=jnp.float32):
    """(config, weights) of a Hugging Face folder, each weight as ``dtype`` (bf16 on a TPU; the
    toy trains in float32). With a mesh, every weight is a jax.Array split over it, and each
    process reads from the safetensors files only the slices its own devices hold."""
    config = json.load(open(os.path.join(folder, "config.json")))
    weights = {}
    for file in sorted(set(shards(folder).values())):
        with safe_open(os.path.join(folder, file), "numpy") as f:
            for name in f.keys():
                part = f.get_slice(name)
                if mesh is None:
                    weights[name] = jnp.asarray(part[:], dtype)
                    continue
                weights[name] = jax.make_array_from_callback(
                    tuple(part.get_shape()), NamedSharding(mesh, spec(name)),
                    lambda index, part=part: jnp.asarray(part[index], dtype))
    if config.get("tie_word_embeddings") or "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]   # Llama 3.2: one matrix, both ends
    return config, weights


def head_dim(config):
    """Each head's width: config.json's head_dim, else hidden_size / heads (as transformers derives it)."""
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def rope_frequencies(config):
    """The rotary embedding's inverse frequencies. With rope_scaling "llama3" (Llama 3.1 and 3.2) the
    long wavelengths are stretched by ``factor``, the short ones kept and those between blended, as
    Meta's reference and transformers' _compute_llama3_parameters do: every position changes."""
    dim = head_dim(config)
    scaling = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = scaling.get("rope_theta") or config.get("rope_theta", 10000.0)
    inv = 1.0 / theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = jnp.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return jnp.where(medium, blended, scaled)


def rms_norm(x, weight, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate(x, positions, inv_freq):
    """Rotary position embedding as Hugging Face's Llama applies it (two halves, not interleaved)."""
    half = x.shape[-1] // 2
    angles = positions[:, None] * inv_freq
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def forward(config, weights, lora, ids, pad=0):
    """Logits for ids [batch, seq]. ``lora`` maps a module's name to (A [r, in], B [out, r], scale):
    that layer computes x @ W.T + scale * x @ A.T @ B.T, as PEFT's LoRA does. The first ``pad``
    positions of every row are padding that no token attends to."""
    heads, kv_heads, hd = config["num_attention_heads"], config["num_key_value_heads"], head_dim(config)
    eps, inv_freq = config["rms_norm_eps"], rope_frequencies(config)
    b, t = ids.shape
    positions = jnp.arange(t) - pad
    keep = jnp.tril(jnp.ones((t, t), bool)) & (jnp.arange(t) >= pad)[None, :]   # causal, padding masked

    def linear(x, name):
        y = x @ weights[f"{name}.weight"].T
        if name in lora:
            a, b_, scale = lora[name]
            y = y + (x @ a.T) @ b_.T * scale
        return y

    x = weights["model.embed_tokens.weight"][ids]
    for i in range(config["num_hidden_layers"]):
        h = rms_norm(x, weights[f"model.layers.{i}.input_layernorm.weight"], eps)
        q = rotate(linear(h, module(i, "q_proj")).reshape(b, t, heads, hd), positions, inv_freq)
        k = rotate(linear(h, module(i, "k_proj")).reshape(b, t, kv_heads, hd), positions, inv_freq)
        v = linear(h, module(i, "v_proj")).reshape(b, t, kv_heads, hd)
        k, v = (jnp.repeat(z, heads // kv_heads, axis=2) for z in (k, v))   # grouped-query attention
        scores = jnp.where(keep, jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(hd), -1e9)
        attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), v).reshape(b, t, heads * hd)
        x = x + linear(attended, module(i, "o_proj"))
        h = rms_norm(x, weights[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
        x = x + linear(jax.nn.silu(linear(h, module(i, "gate_proj"))) * linear(h, module(i, "up_proj")),
                       module(i, "down_proj"))
    return rms_norm(x, weights["model.norm.weight"], eps) @ weights["lm_head.weight"].T
