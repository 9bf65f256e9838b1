"""The model side of planning: a Transformer's shape, its presets, and what it counts to.

A :class:`ModelSpec` comes from a preset (``tpunb/data/models.json``, each citing its source),
a Hugging Face ``config.json`` or a bare parameter count; parameters, FLOPs and KV cache per
token are counted from the shape, never copied, so any config gets the same treatment.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Union

from tpunb.errors import UsageError
from tpunb.plan.quantities import human_count, dtype_bytes, parse_count

MODELS_PATH = Path(__file__).parent.parent / "data" / "models.json"
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
_NOT_GATED = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "bert", "starcoder", "gpt_bigcode"}
_UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "phi3", "olmo", "olmo2"}
_FOUR_NORMS = {"gemma2", "gemma3", "gemma3_text"}
_QK_NORM = {"gemma3", "gemma3_text", "qwen3", "olmo2"}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only Transformer's shape: enough to count its parameters, FLOPs and KV cache."""

    name: str
    layers: int
    d_model: int
    d_ff: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    gated_mlp: bool = True
    experts: int = 1
    experts_per_token: int = 1
    norms_per_layer: int = 2
    qk_norm: bool = False
    attention_bias: bool = False
    extra_params: float = 0.0
    params_override: float | None = None
    estimated: bool = False
    source: str = ""

    @property
    def attention_params_per_layer(self) -> int:
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        weights = 2 * self.d_model * q_width + 2 * self.d_model * kv_width
        bias = (q_width + 2 * kv_width) if self.attention_bias else 0
        return weights + bias + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def mlp_params_per_expert(self) -> int:
        return (3 if self.gated_mlp else 2) * self.d_model * self.d_ff

    @property
    def router_params_per_layer(self) -> int:
        return self.d_model * self.experts if self.experts > 1 else 0

    def breakdown(self) -> dict[str, float]:
        """Parameters by component; sums to :attr:`params`."""
        parts = {
            "embedding": float(self.vocab * self.d_model),
            "unembedding": 0.0 if self.tied_embeddings else float(self.vocab * self.d_model),
            "attention": float(self.layers * self.attention_params_per_layer),
            "mlp": float(self.layers * (self.experts * self.mlp_params_per_expert + self.router_params_per_layer)),
            "norms": float(self.layers * self.norms_per_layer * self.d_model + self.d_model),
            "other": float(self.extra_params),
        }
        if self.params_override is not None:
            parts["other"] += self.params_override - sum(parts.values())
        return parts

    @property
    def params(self) -> float:
        """Total parameters held in memory."""
        return sum(self.breakdown().values())

    @property
    def non_embedding_params(self) -> float:
        b = self.breakdown()
        return self.params - b["embedding"] - b["unembedding"] - b["other"]

    @property
    def active_params(self) -> float:
        """Parameters one token touches (all of them unless the model is a mixture of experts)."""
        idle = (self.experts - self.experts_per_token) * self.layers * self.mlp_params_per_expert
        return self.params - idle - self.extra_params

    @property
    def matmul_params(self) -> float:
        """Parameters that take part in a matmul per token: the input embedding is a lookup."""
        b = self.breakdown()
        lookup = b["embedding"] if not self.tied_embeddings else 0.0
        return self.active_params - lookup - b["norms"]

    def flops_per_token(self, context: int, training: bool = True) -> tuple[float, float]:
        """(dense, attention) FLOPs per token attending to ``context`` tokens.

        Dense is 2 FLOPs per matmul parameter forward, 6 with the backward pass; attention
        adds 4*L*N*H*context forward (12 training), as in PaLM's MFU formula (Chowdhery et
        al. 2022, app. B) and the book's part 4 table, without a causal discount.
        """
        mult = 3 if training else 1
        return 2 * mult * self.matmul_params, 4 * mult * self.layers * self.heads * self.head_dim * context

    def kv_bytes_per_token(self, dtype: str = "bf16") -> float:
        """KV cache bytes per token: 2 (K and V) * layers * KV heads * head dim * dtype size."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes(dtype)

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | os.PathLike, name: str | None = None) -> "ModelSpec":
        """Read a Hugging Face ``config.json`` (dict, file or directory holding one)."""
        if not isinstance(config, Mapping):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise UsageError(f"cannot read model config {str(path)!r}: {e}") from None
            name = name or path.parent.name or path.stem
        outer = dict(config)
        cfg = dict(outer.get("text_config") or outer)
        model_type = str(cfg.get("model_type") or outer.get("model_type") or "").lower()

        def get(*keys: str, default: Any = None) -> Any:
            for k in keys:
                if cfg.get(k) is not None:
                    return cfg[k]
            return default

        d_model = get("hidden_size", "n_embd", "d_model", "dim")
        layers = get("num_hidden_layers", "n_layer", "num_layers", "n_layers")
        heads = get("num_attention_heads", "n_head", "num_heads", "n_heads")
        missing = [k for k, v in {"hidden_size": d_model, "num_hidden_layers": layers, "num_attention_heads": heads}.items() if v is None]
        if missing or cfg.get("vocab_size") is None:
            raise UsageError(
                f"model config lacks {', '.join(missing + ([] if cfg.get('vocab_size') else ['vocab_size']))}: "
                "give a Hugging Face config.json of a decoder-only Transformer, a preset name or a parameter count"
            )
        kv_heads = get("num_key_value_heads", "n_kv_heads", default=1 if cfg.get("multi_query") else heads)
        experts = int(get("num_local_experts", "num_experts", "n_routed_experts", default=1) or 1)
        d_ff = get("moe_intermediate_size") if experts > 1 and get("moe_intermediate_size") else None
        d_ff = d_ff or get("intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size") or 4 * d_model
        tied = cfg.get("tie_word_embeddings", outer.get("tie_word_embeddings"))
        return cls(
            name=name or str(outer.get("_name_or_path") or model_type or "model"),
            layers=int(layers),
            d_model=int(d_model),
            d_ff=int(d_ff),
            heads=int(heads),
            kv_heads=int(kv_heads),
            head_dim=int(get("head_dim", default=d_model // heads)),
            vocab=int(cfg["vocab_size"]),
            tied_embeddings=bool(model_type not in _UNTIED_BY_DEFAULT if tied is None else tied),
            gated_mlp=model_type not in _NOT_GATED,
            experts=experts,
            experts_per_token=int(get("num_experts_per_tok", "moe_top_k", default=1) or 1),
            norms_per_layer=4 if model_type in _FOUR_NORMS else 2,
            qk_norm=model_type in _QK_NORM,
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        )

    @classmethod
    def from_params(cls, count: Union[str, float]) -> "ModelSpec":
        """A Llama-shaped model of about ``count`` parameters, for when only the size is known.

        Shape rule: d_model / layers ~ 128 (Llama 3 8B: 4096/32) and 12*d_model^2 parameters
        per layer; the total is pinned to ``count`` exactly.
        """
        n = parse_count(count, "parameter count")
        if n < 1e6:
            raise UsageError(f"{count!r} is not a model size: give a count like 7B or 350M")
        d_model = max(128, int(round((n * 128 / 12) ** (1 / 3) / 128)) * 128)
        layers = max(1, round(n / (12 * d_model**2)))
        heads = max(1, d_model // 128)
        return cls(
            name=f"{human_count(n)} model (estimated shape)",
            layers=layers,
            d_model=d_model,
            d_ff=int(round(8 * d_model / 3 / 128)) * 128,
            heads=heads,
            kv_heads=heads,
            head_dim=d_model // heads,
            vocab=32000,
            params_override=n,
            estimated=True,
        )


@functools.lru_cache(maxsize=1)
def model_table() -> dict[str, Any]:
    with open(MODELS_PATH, encoding="utf-8") as f:
        return json.load(f)


def _norm_name(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower().split("/")[-1])


@functools.lru_cache(maxsize=1)
def _preset_index() -> dict[str, str]:
    index = {}
    for key, entry in model_table()["models"].items():
        for alias in (key, entry["name"], *entry.get("aliases", ())):
            index[_norm_name(alias)] = key
    return index


def presets() -> list[str]:
    """Names of the model presets (``llama3-8b``, ``gemma2-9b``...)."""
    return list(model_table()["models"])


def preset(name: str) -> ModelSpec:
    """A preset model by name or alias; raises UsageError with close names."""
    key = _preset_index().get(_norm_name(name))
    if key is None:
        close = difflib.get_close_matches(_norm_name(name), list(_preset_index()), n=3, cutoff=0.6)
        close_keys = list(dict.fromkeys(_preset_index()[c] for c in close))
        hint = f"; did you mean {' or '.join(close_keys)}?" if close_keys else ""
        raise UsageError(
            f"unknown model {name!r}: presets are {', '.join(presets())}; "
            f"or pass a config.json path or a parameter count like 7B{hint}"
        )
    entry = model_table()["models"][key]
    spec = ModelSpec.from_config(entry["config"], name=entry["name"])
    return dataclasses.replace(spec, extra_params=float(entry.get("extra_params", 0.0)), source=entry["source"])


def resolve_model(model: Union[str, float, int, Mapping[str, Any], ModelSpec, os.PathLike]) -> ModelSpec:
    """Anything a user may call a model: a ModelSpec, config dict or path, preset, or count."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping) or isinstance(model, os.PathLike):
        return ModelSpec.from_config(model)
    if isinstance(model, (int, float)) and not isinstance(model, bool):
        return ModelSpec.from_params(model)
    if isinstance(model, str):
        text = model.strip()
        if text.endswith(".json") or os.path.isdir(text) or os.path.isfile(text):
            return ModelSpec.from_config(text)
        if re.fullmatch(r"[0-9.]+(e[0-9]+)?\s*[kmbgt]?", text.lower()):
            return ModelSpec.from_params(text)
        return preset(text)
    raise UsageError(f"cannot plan for {model!r}: give a preset name, a config dict or path, or a count like 7B")


def lora_params(model: ModelSpec, rank: int, targets: Iterable[str]) -> float:
    """Trainable LoRA parameters: rank * (fan_in + fan_out) per targeted matrix per layer."""
    d, q, kv, f = model.d_model, model.heads * model.head_dim, model.kv_heads * model.head_dim, model.d_ff
    shapes = {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d), "gate": (d, f), "up": (d, f), "down": (f, d)}
    experts = {"gate": model.experts, "up": model.experts, "down": model.experts}
    return float(model.layers * sum(rank * sum(shapes[t]) * experts.get(t, 1) for t in set(targets)))
