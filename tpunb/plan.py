"""How big, how long, how much: memory, FLOPs, time and cost of a model on every TPU.

The method is the one of "How to Scale Your Model" (Austin et al., jax-ml/scaling-book):
count parameters and FLOPs from the config, put memory per component next to HBM, then
compare compute time with HBM and ICI time (a roofline) for each candidate mesh, and take
the slowest as the step time. Chip numbers and prices come from :mod:`tpunb.catalog`.

Estimates, not measurements: they ignore compiler overheads beyond the target MFU, assume
flash attention (no S x S score matrix in memory) and one slice (no DCN/multislice).
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Union

from tpunb import catalog
from tpunb.catalog import Accelerator
from tpunb.errors import UnknownAcceleratorError, UsageError

if TYPE_CHECKING:
    import pandas

MODELS_PATH = Path(__file__).parent / "data" / "models.json"
GIB = 2**30
DTYPE_BYTES = {
    "fp32": 4.0, "float32": 4.0, "f32": 4.0,
    "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0, "f16": 2.0,
    "fp8": 1.0, "float8": 1.0, "int8": 1.0, "i8": 1.0,
    "int4": 0.5, "i4": 0.5,
}
# Optimizer state elements kept per trainable parameter (the master fp32 copy is separate).
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "lion": 1, "momentum": 1, "sgd": 0, "adafactor": 0}
REMAT_POLICIES = ("full", "ffw", "dots", "none")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
_NOT_GATED = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "bert", "starcoder", "gpt_bigcode"}
_UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "phi3", "olmo", "olmo2"}
_FOUR_NORMS = {"gemma2", "gemma3", "gemma3_text"}
_QK_NORM = {"gemma3", "gemma3_text", "qwen3", "olmo2"}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a dtype name (``bf16``, ``int8``, ``fp32``...)."""
    try:
        return DTYPE_BYTES[dtype.lower()]
    except (KeyError, AttributeError):
        raise UsageError(
            f"unknown dtype {dtype!r}: use one of {', '.join(sorted(set(DTYPE_BYTES) - {'f32', 'f16', 'i8', 'i4'}))}"
        ) from None


_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_count(value: Union[str, float, int], what: str = "count") -> float:
    """``"7B"`` -> 7e9, ``"1M"`` -> 1e6, ``"1Mi"`` or ``"2^20"`` -> 1048576, numbers unchanged."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower().replace("_", "").replace(",", "")
    m = re.fullmatch(r"(\d+)\^(\d+)", text)
    if m:
        return float(int(m[1]) ** int(m[2]))
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*(ki|mi|gi|k|m|b|g|t)?", text)
    if not m:
        raise UsageError(f"cannot read {what} {value!r}: write it like 4096, 1M, 2^20, 7B or 1.5e12")
    return float(m[1]) * _SUFFIX[m[2] or ""]


def parse_duration(value: Union[str, float, int]) -> float:
    """Seconds from ``"36h"``, ``"30d"``, ``"2w"``, ``"90m"``; a bare number counts hours."""
    if isinstance(value, (int, float)):
        return float(value) * 3600
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h|d|w)?\s*", str(value).lower())
    if not m:
        raise UsageError(f"cannot read duration {value!r}: write it like 36h, 30d or 2w")
    return float(m[1]) * {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}[m[2] or "h"]


# --------------------------------------------------------------------------- the model


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
            name=f"{_human_count(n)} params",
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
def _models() -> dict[str, Any]:
    with open(MODELS_PATH, encoding="utf-8") as f:
        return json.load(f)


def _norm_name(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower().split("/")[-1])


@functools.lru_cache(maxsize=1)
def _preset_index() -> dict[str, str]:
    index = {}
    for key, entry in _models()["models"].items():
        for alias in (key, entry["name"], *entry.get("aliases", ())):
            index[_norm_name(alias)] = key
    return index


def presets() -> list[str]:
    """Names of the model presets (``llama3-8b``, ``gemma2-9b``...)."""
    return list(_models()["models"])


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
    entry = _models()["models"][key]
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


# --------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Training:
    """A training or fine-tuning run.

    ``batch_tokens``: global batch per optimizer step; ``tokens``: the whole run (None gives
    per-step figures only); ``remat``: ``"full"`` saves each layer's input, ``"ffw"`` the FFW
    matmul outputs, ``"dots"`` every matmul output, ``"none"`` everything, or an int of
    d_model-sized checkpoints per layer; ``mfu``: target model FLOPs utilisation;
    ``lora_rank``: train rank-r adapters on ``lora_targets`` with the base weights frozen.
    """

    batch_tokens: float = 2**20
    seq_len: int = 4096
    tokens: float | None = None
    optimizer: str = "adamw"
    param_dtype: str = "bf16"
    optimizer_dtype: str = "fp32"
    master_weights: bool = False
    remat: Union[str, int] = "full"
    mfu: float = 0.4
    microbatches: int = 1
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] = ("q", "v")

    def __post_init__(self) -> None:
        _check(self.optimizer.lower() in OPTIMIZER_STATES, f"unknown optimizer {self.optimizer!r}: use one of {', '.join(OPTIMIZER_STATES)}")
        dtype_bytes(self.param_dtype), dtype_bytes(self.optimizer_dtype)
        _check(isinstance(self.remat, int) and self.remat > 0 or self.remat in REMAT_POLICIES,
               f"unknown remat policy {self.remat!r}: use {', '.join(REMAT_POLICIES)} or a number of d_model-sized checkpoints per layer")
        _check(0 < self.mfu <= 1, f"mfu must be in (0, 1], not {self.mfu}")
        _check(self.batch_tokens >= self.seq_len > 0, f"batch of {self.batch_tokens:.0f} tokens is smaller than one sequence of {self.seq_len}")
        _check(self.microbatches >= 1, "microbatches must be at least 1")
        _check(self.lora_rank is None or self.lora_rank >= 1, "lora_rank must be at least 1")
        bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
        _check(not bad, f"unknown LoRA targets {bad}: use some of {', '.join(LORA_TARGETS)}")


@dataclass(frozen=True)
class Serving:
    """Serving: ``batch`` concurrent sequences, each with up to ``context`` tokens of KV cache.

    ``kv_dtype`` defaults to the weight dtype; ``output_tokens`` (generated per request) splits
    the context into prompt and decode; ``mfu`` applies to compute-bound prefill.
    """

    weight_dtype: str = "bf16"
    batch: int = 1
    context: int = 4096
    kv_dtype: str | None = None
    output_tokens: int = 512
    mfu: float = 0.5

    def __post_init__(self) -> None:
        dtype_bytes(self.weight_dtype), dtype_bytes(self.kv_cache_dtype)
        _check(self.batch >= 1 and self.context >= 1, "batch and context must be at least 1")
        _check(0 < self.mfu <= 1, f"mfu must be in (0, 1], not {self.mfu}")

    @property
    def kv_cache_dtype(self) -> str:
        return self.kv_dtype or self.weight_dtype

    @property
    def prompt_tokens(self) -> int:
        return max(1, self.context - self.output_tokens)


Workload = Union[Training, Serving]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Memory:
    """Bytes of the whole job (not per chip), by component."""

    params: float
    optimizer: float = 0.0
    gradients: float = 0.0
    activations: float = 0.0
    kv_cache: float = 0.0

    @property
    def total(self) -> float:
        return self.params + self.optimizer + self.gradients + self.activations + self.kv_cache


@dataclass(frozen=True)
class Mesh:
    """Device mesh sizes; ``jax.make_mesh(mesh.shape, mesh.names)`` builds it."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.data, self.fsdp, self.tensor)

    @property
    def names(self) -> tuple[str, str, str]:
        return ("data", "fsdp", "tensor")

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.tensor

    def __str__(self) -> str:
        parts = [f"{n} {s}" for n, s in zip(self.names, self.shape, strict=True) if s > 1]
        return " x ".join(parts) if parts else "1 chip"


@dataclass(frozen=True)
class SliceEstimate:
    """The workload on one slice: does it fit, which mesh, what bounds it, time and money."""

    accelerator: str
    generation: str
    chips: int
    hosts: int
    fits: bool
    memory_per_chip: float
    hbm_per_chip: float
    mesh: Mesh
    bound: str  # "compute", "HBM bandwidth" or "ICI"
    reason: str
    step_seconds: float
    compute_seconds: float
    hbm_seconds: float
    ici_seconds: float
    usd_per_hour: float | None
    spot_usd_per_hour: float | None
    total_seconds: float | None = None
    cost_usd: float | None = None
    spot_cost_usd: float | None = None
    tokens_per_second: float = 0.0
    usd_per_million_tokens: float | None = None
    prefill_seconds: float | None = None
    max_batch: int | None = None

    @property
    def total_hours(self) -> float | None:
        return None if self.total_seconds is None else self.total_seconds / 3600


@dataclass(frozen=True)
class Plan:
    """Everything :func:`plan` worked out; ``options`` holds one slice per generation."""

    model: ModelSpec
    workload: Workload
    memory: Memory
    trainable_params: float
    dense_flops_per_token: float
    attention_flops_per_token: float
    flops_per_step: float
    options: tuple[SliceEstimate, ...]
    notes: tuple[str, ...] = ()
    spot: bool = False
    hbm_reserve: float = 0.1
    deadline_seconds: float | None = None

    @property
    def params(self) -> float:
        return self.model.params

    @property
    def flops_per_token(self) -> float:
        return self.dense_flops_per_token + self.attention_flops_per_token

    @property
    def total_flops(self) -> float | None:
        w = self.workload
        return self.flops_per_token * w.tokens if isinstance(w, Training) and w.tokens else None

    def best(self, by: str = "cost") -> SliceEstimate:
        """The cheapest (``by="cost"``) or fastest (``by="time"``) option that fits."""
        _check(by in ("cost", "time"), f"best(by=...) takes 'cost' or 'time', not {by!r}")
        fitting = [o for o in self.options if o.fits]
        if not fitting:
            raise UsageError("no slice considered holds this workload: shrink the batch, use remat, LoRA or more chips")
        if by == "time":
            return min(fitting, key=lambda o: o.step_seconds)
        priced = [o for o in fitting if _option_cost(o, self) is not None]
        return min(priced or fitting, key=lambda o: _option_cost(o, self) or math.inf)

    def on(self, tpu: str | Accelerator, chips: int | None = None, topology: str | None = None) -> SliceEstimate:
        """This workload on one given slice (``"v5p-128"``) or any chip count of a generation."""
        acc = _custom_slice(tpu, chips, topology)
        return _evaluate(self.model, self.workload, acc, self.memory, self.hbm_reserve)

    def table(self) -> "pandas.DataFrame":
        """The options as a DataFrame, one row per slice."""
        import pandas

        rows = [_option_row(o, self) for o in self.options]
        return pandas.DataFrame(rows).set_index("slice") if rows else pandas.DataFrame()

    def memory_table(self) -> "pandas.DataFrame":
        """Memory by component, in GiB."""
        import pandas

        rows = {k: v / GIB for k, v in dataclasses.asdict(self.memory).items()}
        rows["total"] = self.memory.total / GIB
        return pandas.DataFrame({"GiB": rows})

    def __str__(self) -> str:
        return _render_text(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        return _render_html(self)


# --------------------------------------------------------------------------- the book's formulas


def ici_intensity(acc: Accelerator) -> float:
    """alpha = C / W_ici: FLOPs per byte over one bidirectional ICI axis (2550 on v5p)."""
    return acc.bf16_flops / (2 * acc.ici_bandwidth)


def hbm_intensity(acc: Accelerator) -> float:
    """C / HBM bandwidth: tokens per chip needed for a bf16 matmul to be compute-bound (~240 v5e)."""
    return acc.bf16_flops / acc.hbm_bandwidth


def fsdp_min_tokens_per_chip(acc: Accelerator, axes: int = 1) -> float:
    """Below this per-chip batch, data parallelism / FSDP is ICI-bound: alpha / axes."""
    return ici_intensity(acc) / axes


def max_tensor_parallel(d_ff: float, acc: Accelerator, axes: int = 1) -> float:
    """Tensor parallelism beyond ``axes * F / alpha`` ways is ICI-bound."""
    return axes * d_ff / ici_intensity(acc)


def mixed_min_tokens_per_chip(d_ff: float, acc: Accelerator, fsdp_axes: int = 2, tp_axes: int = 1) -> float:
    """Floor of per-chip batch for mixed FSDP + TP: 4 alpha^2 / (F Mx My) (2 alpha^2 / F by default)."""
    return 4 * ici_intensity(acc) ** 2 / (d_ff * fsdp_axes * tp_axes)


def fsdp_tp_split(batch_tokens: float, d_ff: float, chips: int, acc: Accelerator,
                  fsdp_axes: int = 2, tp_axes: int = 1) -> float | None:
    """The book's optimal FSDP size X for mixed FSDP + TP (Y = chips / X); None when comms-bound."""
    a, b, f, n = ici_intensity(acc), batch_tokens, d_ff, chips
    disc = (b * f * fsdp_axes * tp_axes) ** 2 - 4 * a**2 * f * b * n * tp_axes * fsdp_axes
    if disc < 0:
        return None
    return b * fsdp_axes / (2 * a) + math.sqrt(disc) / (2 * a * f * tp_axes)


# --------------------------------------------------------------------------- estimates


def _remat_elements(model: ModelSpec, remat: Union[str, int]) -> float:
    """Activation elements saved per token per layer under a checkpoint policy."""
    d, f = model.d_model, model.d_ff * model.experts_per_token
    mlp_in = 2 * f if model.gated_mlp else f
    qkv = model.heads * model.head_dim + 2 * model.kv_heads * model.head_dim
    if isinstance(remat, int):
        return remat * d  # the book's "N checkpoints of size d_model per layer"
    return {
        "full": d,  # block remat: only the layer input (book part 4)
        "ffw": d + mlp_in,  # outputs of the big FFW matmuls (book part 5, problem 2)
        "dots": qkv + d + mlp_in + d,  # every big matmul output (jax dots_saveable)
        "none": qkv + d + mlp_in + d + 4 * d + model.heads * model.head_dim + f,  # keep everything
    }[remat]


def lora_params(model: ModelSpec, rank: int, targets: Iterable[str]) -> float:
    """Trainable LoRA parameters: rank * (fan_in + fan_out) per targeted matrix per layer."""
    d, q, kv, f = model.d_model, model.heads * model.head_dim, model.kv_heads * model.head_dim, model.d_ff
    shapes = {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d), "gate": (d, f), "up": (d, f), "down": (f, d)}
    experts = {"gate": model.experts, "up": model.experts, "down": model.experts}
    return float(model.layers * sum(rank * sum(shapes[t]) * experts.get(t, 1) for t in set(targets)))


def _train_memory(model: ModelSpec, w: Training) -> tuple[Memory, float]:
    p_bytes, o_bytes = dtype_bytes(w.param_dtype), dtype_bytes(w.optimizer_dtype)
    trainable = lora_params(model, w.lora_rank, w.lora_targets) if w.lora_rank else model.params
    states = OPTIMIZER_STATES[w.optimizer.lower()]
    per_trainable = states * o_bytes + (4.0 if w.master_weights else 0.0)
    acts = w.batch_tokens / w.microbatches * model.layers * _remat_elements(model, w.remat) * 2
    memory = Memory(
        params=(model.params + (trainable if w.lora_rank else 0.0)) * p_bytes,
        optimizer=trainable * per_trainable,
        gradients=trainable * p_bytes,
        activations=acts,
    )
    return memory, trainable


def _serve_memory(model: ModelSpec, w: Serving) -> Memory:
    """Weights, the whole batch's KV cache, and the working set of one prefill chunk.

    The chunk is one layer's bf16 activations for up to 8192 prompt tokens (chunked prefill).
    """
    width = model.d_model * 2 + model.heads * model.head_dim + 2 * model.kv_heads * model.head_dim
    width += model.d_ff * model.experts_per_token * (2 if model.gated_mlp else 1)
    return Memory(
        params=model.params * dtype_bytes(w.weight_dtype),
        activations=min(w.context, 8192) * width * 2.0,
        kv_cache=w.batch * w.context * model.kv_bytes_per_token(w.kv_cache_dtype),
    )


def _axes(acc: Accelerator, wraparound_min: int) -> list[tuple[int, bool]]:
    """(size, has wraparound) for each topology axis longer than 1."""
    return [(s, s >= wraparound_min and s % wraparound_min == 0) for s in acc.mesh_shape if s > 1]


def _split_axes(axes: list[tuple[int, bool]], tp: int) -> tuple[float, float]:
    """Effective number of bidirectional ICI rings given to the data/FSDP and tensor axes.

    The tensor axis takes the smallest physical axes it needs; an axis without wraparound
    counts half (the book: a line, not a ring, has half the bidirectional bandwidth).
    """
    if not axes:
        return 1.0, 1.0
    ring = [1.0 if wrap else 0.5 for _, wrap in axes]
    if tp <= 1:
        return max(sum(ring), 0.5), 1.0
    order = sorted(range(len(axes)), key=lambda i: axes[i][0])
    taken, covered = [], 1
    for i in order:
        if covered >= tp:
            break
        taken.append(i)
        covered *= axes[i][0]
    rest = [ring[i] for i in range(len(axes)) if i not in taken]
    return max(sum(rest), 0.5), max(sum(ring[i] for i in taken), 0.5)


def _pow2_divisors(n: int) -> list[int]:
    return [d for d in (2**k for k in range(0, 16)) if d <= n and n % d == 0]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _evaluate(model: ModelSpec, w: Workload, acc: Accelerator, memory: Memory, reserve: float) -> SliceEstimate:
    g = catalog.generation(acc.generation)
    usable = acc.hbm_bytes_per_chip * (1 - reserve)
    axes = _axes(acc, g.ici_wraparound_min)
    fn = _evaluate_train if isinstance(w, Training) else _evaluate_serve
    return fn(model, w, acc, memory, usable, axes)


def _price(acc: Accelerator, spot: bool) -> float | None:
    per_chip = acc.spot_price_per_chip_hour if spot else acc.price_per_chip_hour
    return None if per_chip is None else per_chip * acc.chips


def _estimate(acc: Accelerator, **kw: Any) -> SliceEstimate:
    return SliceEstimate(
        accelerator=acc.name, generation=acc.generation, chips=acc.chips, hosts=acc.hosts,
        hbm_per_chip=acc.hbm_bytes_per_chip, usd_per_hour=_price(acc, False),
        spot_usd_per_hour=_price(acc, True), **kw,
    )


def _slack(compute: float, ici: float, hbm: float) -> float:
    """0 when compute-bound at peak, else how far the slowest transfer overshoots compute."""
    worst = max(ici, hbm)
    return 0.0 if worst <= compute else worst / compute


def _bound(compute: float, hbm: float, ici: float) -> str:
    return max((compute, "compute"), (hbm, "HBM bandwidth"), (ici, "ICI"))[1]


@dataclass(frozen=True)
class _MeshCost:
    """One candidate mesh on one slice: memory per chip and the three roofline times."""

    mesh: Mesh
    per_chip: float
    fits: bool
    t_math: float
    t_ici: float
    t_hbm: float
    step: float
    fsdp_rings: float
    tp_rings: float
    batch: int = 0  # serving: sequences per replica

    def key(self, per: float = 1.0) -> tuple:
        """Fitting first, then fastest (per unit of ``per``), then most compute-bound, then simplest."""
        slack = _slack(self.t_math, self.t_ici, self.t_hbm)
        return (not self.fits, round(self.step / per, 15), slack, self.mesh.tensor, self.mesh.fsdp)


def _train_cost(model: ModelSpec, w: Training, acc: Accelerator, memory: Memory, usable: float,
                axes: list[tuple[int, bool]], t_math: float, fsdp: int, tp: int) -> _MeshCost:
    n, w_bi = acc.chips, 2 * acc.ici_bandwidth
    data = n // (tp * fsdp)
    data_ways = data * fsdp
    per_chip = (memory.params + memory.optimizer + memory.gradients) / (fsdp * tp) + memory.activations / n
    m_x, m_y = _split_axes(axes, tp)
    weight_bytes = model.params * dtype_bytes(w.param_dtype)
    t_data = 0.0
    if data_ways > 1 and fsdp > 1:  # FSDP: AllGather fwd + bwd, ReduceScatter grads (none if frozen)
        t_data = (2 if w.lora_rank else 3) * w.microbatches * weight_bytes / tp / (w_bi * m_x)
    elif data_ways > 1:  # pure data parallelism: one gradient AllReduce (= 2 collectives)
        t_data = 2 * memory.gradients / tp / (w_bi * m_x)
    t_tp = 0.0
    if tp > 1:  # AllGather + ReduceScatter of bf16 [B/X, D] around attention and MLP, fwd and 2x bwd
        t_tp = 3 * 2 * 2 * model.layers * 2 * (w.batch_tokens / data_ways) * model.d_model / (w_bi * m_y)
    update_bytes = 2 * (memory.optimizer + memory.gradients) + memory.params
    t_hbm = (3 * w.microbatches * weight_bytes / tp + update_bytes / (fsdp * tp)) / acc.hbm_bandwidth
    t_ici = t_data + t_tp
    return _MeshCost(Mesh(data, fsdp, tp), per_chip, per_chip <= usable, t_math, t_ici, t_hbm,
                     max(t_math / w.mfu, t_ici, t_hbm), m_x, m_y)


def _evaluate_train(model: ModelSpec, w: Training, acc: Accelerator, memory: Memory,
                    usable: float, axes: list[tuple[int, bool]]) -> SliceEstimate:
    n = acc.chips
    dense, attn = model.flops_per_token(w.seq_len, training=True)
    if w.lora_rank:  # frozen weights: no weight gradients, so 2/3 of the dense backward
        dense *= 2 / 3
    t_math = (dense + attn) * w.batch_tokens / (n * acc.bf16_flops)
    best = min(
        (_train_cost(model, w, acc, memory, usable, axes, t_math, fsdp, tp)
         for tp in _pow2_divisors(n) if tp == 1 or tp <= model.heads
         for fsdp in _divisors(n // tp)),
        key=_MeshCost.key,
    )
    reason = (
        f"per step at peak: compute {_human_time(t_math)}, ICI {_human_time(best.t_ici)}, HBM {_human_time(best.t_hbm)}; "
        f"{w.batch_tokens / n:,.0f} tokens/chip vs FSDP floor α/axes {fsdp_min_tokens_per_chip(acc, best.fsdp_rings):,.0f}, "
        f"FSDP+TP floor 2α²/F {mixed_min_tokens_per_chip(model.d_ff, acc):,.0f}, "
        f"TP limit F·axes/α {max_tensor_parallel(model.d_ff, acc, max(1, round(best.tp_rings))):.0f}"
    )
    total = best.step * w.tokens / w.batch_tokens if w.tokens else None
    price, spot_price = _price(acc, False), _price(acc, True)
    return _estimate(
        acc, fits=best.fits, memory_per_chip=best.per_chip, mesh=best.mesh,
        bound=_bound(t_math, best.t_hbm, best.t_ici), reason=reason, step_seconds=best.step,
        compute_seconds=t_math, hbm_seconds=best.t_hbm, ici_seconds=best.t_ici, total_seconds=total,
        cost_usd=None if total is None or price is None else total / 3600 * price,
        spot_cost_usd=None if total is None or spot_price is None else total / 3600 * spot_price,
        tokens_per_second=w.batch_tokens / best.step,
        usd_per_million_tokens=None if price is None else price / 3600 * best.step / w.batch_tokens * 1e6,
    )


def _serve_cost(model: ModelSpec, w: Serving, acc: Accelerator, memory: Memory, usable: float,
                axes: list[tuple[int, bool]], tp: int) -> _MeshCost:
    dp = acc.chips // tp
    batch = max(1, math.ceil(w.batch / dp))
    kv = batch * w.context * model.kv_bytes_per_token(w.kv_cache_dtype)
    per_chip = (memory.params + kv + memory.activations) / tp
    dense, attn = model.flops_per_token(w.context, training=False)
    t_math = batch * (dense + attn) / (tp * acc.bf16_flops)
    t_hbm = (memory.params + kv) / tp / acc.hbm_bandwidth  # every decode step reads weights and KV once
    _, m_y = _split_axes(axes, tp)
    # Tensor parallelism moves activations: AllGather + ReduceScatter of bf16 [B, D] per block.
    t_ici = 0.0 if tp == 1 else 2 * 2 * model.layers * 2 * batch * model.d_model / (2 * acc.ici_bandwidth * m_y)
    return _MeshCost(Mesh(dp, 1, tp), per_chip, per_chip <= usable, t_math, t_ici, t_hbm,
                     max(t_math / w.mfu, t_hbm, t_ici), 1.0, m_y, batch)


def _evaluate_serve(model: ModelSpec, w: Serving, acc: Accelerator, memory: Memory,
                    usable: float, axes: list[tuple[int, bool]]) -> SliceEstimate:
    best = min((_serve_cost(model, w, acc, memory, usable, axes, tp) for tp in _pow2_divisors(acc.chips)),
               key=lambda cost: cost.key(per=w.batch))
    kv_per_seq = w.context * model.kv_bytes_per_token(w.kv_cache_dtype)
    reason = (
        f"per decode step at peak: HBM {_human_time(best.t_hbm)} (weights + KV, "
        f"{(memory.params + best.batch * kv_per_seq) / best.mesh.tensor / GIB:,.2f} GiB/chip), "
        f"compute {_human_time(best.t_math)}, ICI {_human_time(best.t_ici)}; batch {best.batch}/replica vs "
        f"C/HBM {hbm_intensity(acc):,.0f} for compute-bound weights, "
        f"TP limit F·axes/α {max_tensor_parallel(model.d_ff, acc, max(1, round(best.tp_rings))):.0f}"
    )
    free = usable * acc.chips - (memory.params + memory.activations) * best.mesh.data
    prefill_flops = sum(model.flops_per_token(w.prompt_tokens // 2, training=False)) * w.prompt_tokens
    price = _price(acc, False)
    tps = w.batch / best.step
    return _estimate(
        acc, fits=best.fits, memory_per_chip=best.per_chip, mesh=best.mesh,
        bound=_bound(best.t_math, best.t_hbm, best.t_ici), reason=reason, step_seconds=best.step,
        compute_seconds=best.t_math, hbm_seconds=best.t_hbm, ici_seconds=best.t_ici, tokens_per_second=tps,
        usd_per_million_tokens=None if price is None else price / 3600 / tps * 1e6,
        prefill_seconds=prefill_flops / (best.mesh.tensor * acc.bf16_flops * w.mfu),
        max_batch=max(0, int(free // kv_per_seq)),
    )


def _custom_slice(tpu: str | Accelerator, chips: int | None, topology: str | None) -> Accelerator:
    """A catalog slice, or a generation at any chip count/topology (e.g. the book's v5p 16x20x28)."""
    if isinstance(tpu, Accelerator):
        return tpu
    if chips is None and topology is None:
        return catalog.lookup(tpu)
    return catalog.hypothetical(tpu, topology=topology, chips=chips)


# --------------------------------------------------------------------------- plan()


def plan(
    model: Union[str, float, int, Mapping[str, Any], ModelSpec, os.PathLike],
    workload: Union[str, Workload] = "train",
    *,
    tpu: Union[str, Iterable[str], None] = None,
    spot: bool = False,
    deadline: Union[str, float, None] = None,
    hbm_reserve: float = 0.1,
    **options: Any,
) -> Plan:
    """Memory, FLOPs, time and cost of training or serving ``model`` on Cloud TPUs.

    ``model``: a preset (``"llama3-8b"``), a Hugging Face config dict or config.json path, or a
    parameter count (``"7B"``). ``workload``: ``"train"``/``"serve"`` with ``options`` filling
    :class:`Training` / :class:`Serving` fields, or an instance of one. ``tpu``: generations or
    slices to consider (all by default). For each generation the plan keeps the smallest slice
    that holds the job (and, with ``deadline``, finishes in time). ``hbm_reserve`` is the share
    of HBM left for XLA scratch, fragmentation and the runtime.
    """
    spec = resolve_model(model)
    w = _make_workload(workload, options)
    _check(0 <= hbm_reserve < 1, f"hbm_reserve must be in [0, 1), not {hbm_reserve}")
    deadline_s = parse_duration(deadline) if deadline is not None else None
    if isinstance(w, Training):
        memory, trainable = _train_memory(spec, w)
        dense, attn = spec.flops_per_token(w.seq_len, training=True)
        if w.lora_rank:
            dense *= 2 / 3
        per_step = (dense + attn) * w.batch_tokens
    else:
        memory, trainable = _serve_memory(spec, w), 0.0
        dense, attn = spec.flops_per_token(w.context, training=False)
        per_step = (dense + attn) * w.batch
    options_, notes = _choose(spec, w, memory, _candidates(tpu), hbm_reserve, deadline_s, spot)
    notes = _notes(spec, w, memory) + notes
    return Plan(
        model=spec, workload=w, memory=memory, trainable_params=trainable,
        dense_flops_per_token=dense, attention_flops_per_token=attn, flops_per_step=per_step,
        options=tuple(options_), notes=tuple(notes), spot=spot, hbm_reserve=hbm_reserve,
        deadline_seconds=deadline_s,
    )


def _make_workload(workload: Union[str, Workload], options: dict[str, Any]) -> Workload:
    if isinstance(workload, (Training, Serving)):
        _check(not options, "pass either a Training/Serving object or keyword options, not both")
        return workload
    kinds = {"train": Training, "training": Training, "finetune": Training, "fine-tune": Training,
             "serve": Serving, "serving": Serving, "inference": Serving}
    cls = kinds.get(str(workload).lower())
    _check(cls is not None, f"workload must be 'train' or 'serve', not {workload!r}")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in options if k not in fields]
    if unknown:
        close = difflib.get_close_matches(unknown[0], fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"{cls.__name__.lower()} has no option {unknown[0]!r}{hint}; options are {', '.join(sorted(fields))}")
    if cls is Training:
        for k in ("batch_tokens", "tokens"):
            if isinstance(options.get(k), str):
                options[k] = parse_count(options[k], k)
        if isinstance(options.get("remat"), str) and options["remat"].isdigit():
            options["remat"] = int(options["remat"])
        if "lora_targets" in options and isinstance(options["lora_targets"], str):
            options["lora_targets"] = tuple(t for t in re.split(r"[\s,]+", options["lora_targets"]) if t)
    for k in ("seq_len", "batch", "context", "output_tokens", "microbatches", "lora_rank"):
        if isinstance(options.get(k), (str, float)):
            options[k] = int(parse_count(options[k], k))
    return cls(**options)


def _candidates(tpu: Union[str, Iterable[str], None]) -> list[tuple[str, list[Accelerator]]]:
    """(label, slices to try in order) per generation or per explicitly named slice."""
    if tpu is None:
        words: list[str] = [g.key for g in catalog.generations()]
    elif isinstance(tpu, str):
        words = [t for t in re.split(r"[\s,]+", tpu) if t]
    else:
        words = list(tpu)
    out = []
    for word in words:
        try:
            g = catalog.generation(word)
        except UnknownAcceleratorError:
            acc = catalog.lookup(word)
            out.append((acc.name, [acc]))
            continue
        out.append((g.key, [catalog.lookup(n) for n in g.size_names()]))
    return out


def _choose(model: ModelSpec, w: Workload, memory: Memory, candidates: list[tuple[str, list[Accelerator]]],
            reserve: float, deadline: float | None, spot: bool) -> tuple[list[SliceEstimate], list[str]]:
    chosen, notes = [], []
    for label, accs in candidates:
        pick, last = None, None
        for acc in accs:
            if acc.hbm_bytes * (1 - reserve) < memory.total and len(accs) > 1:
                continue  # cannot fit whatever the mesh: skip the full evaluation
            est = _evaluate(model, w, acc, memory, reserve)
            last = est
            on_time = deadline is None or est.total_seconds is None or est.total_seconds <= deadline
            if est.fits and on_time:
                pick = est
                break
        if pick is None and len(accs) == 1:
            pick = last or _evaluate(model, w, accs[0], memory, reserve)
        if pick is None:
            biggest = accs[-1]
            why = "finishes within the deadline" if last is not None and last.fits else "holds it"
            notes.append(
                f"no {label} slice {why}: largest {biggest.name} has {biggest.hbm_bytes / GIB:,.0f} GiB HBM, "
                f"the job needs {memory.total / GIB:,.0f} GiB"
            )
            continue
        chosen.append(pick)
    return chosen, notes


def _notes(model: ModelSpec, w: Workload, memory: Memory) -> list[str]:
    notes = []
    if model.estimated:
        notes.append(f"shape estimated from the parameter count ({model.layers} layers, d_model {model.d_model}); pass a config for exact numbers")
    if model.experts > 1:
        notes.append("mixture of experts: FLOPs use active parameters; expert parallelism is not modelled")
    if isinstance(w, Training):
        if memory.activations > 0.5 * memory.total:
            remedy = "microbatches (gradient accumulation)" + ("" if w.remat == "full" else " or remat='full'")
            notes.append(f"activations are {memory.activations / memory.total:.0%} of memory: {remedy} shrinks them")
        notes.append("time at the target MFU counts model FLOPs (6 per param per token + attention); remat recompute is inside that MFU")
    else:
        if dtype_bytes(w.weight_dtype) < 2:
            notes.append("quantized weights: servers that load bf16 then quantize (vLLM on TPU, per dstack) need bf16 room at load")
        notes.append("decode time is a roofline (weights + KV read once per step); real servers get maybe half (scaling book part 8)")
    return notes


def _option_cost(o: SliceEstimate, p: Plan) -> float | None:
    """What ranks options by money: USD per million tokens (trained or generated)."""
    per_hour = o.spot_usd_per_hour if p.spot else o.usd_per_hour
    return None if per_hour is None else per_hour / 3600 / o.tokens_per_second * 1e6


# --------------------------------------------------------------------------- rendering


def _human_count(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def _sig(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _human_time(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, size in (("years", 365 * 86400), ("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if s >= size:
            return f"{_sig(s / size)} {unit}"
    return f"{_sig(s * 1e3)} ms" if s >= 1e-3 else f"{_sig(s * 1e6)} us"


def _money(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}" if x >= 0.01 else f"${x:.2g}"


def _option_row(o: SliceEstimate, p: Plan) -> dict[str, Any]:
    """One option as numbers (seconds, GiB, USD), for DataFrames that sort and plot."""
    row: dict[str, Any] = {
        "slice": o.accelerator, "generation": o.generation, "chips": o.chips, "hosts": o.hosts,
        "fits": o.fits, "mesh": str(o.mesh), "gib_per_chip": o.memory_per_chip / GIB,
        "hbm_gib_per_chip": o.hbm_per_chip / GIB, "bound": o.bound, "step_s": o.step_seconds,
        "tokens_per_s": o.tokens_per_second, "usd_per_hour": o.usd_per_hour,
        "usd_per_1m_tokens": o.usd_per_million_tokens,
    }
    if isinstance(p.workload, Training):
        row.update({"total_h": o.total_hours, "cost_usd": o.cost_usd, "spot_cost_usd": o.spot_cost_usd})
    else:
        row.update({"prefill_s": o.prefill_seconds, "max_batch": o.max_batch})
    return row


def _display_row(o: SliceEstimate, p: Plan) -> dict[str, str]:
    """One option as a person reads it."""
    row = {
        "slice": o.accelerator, "chips": str(o.chips), "hosts": str(o.hosts), "mesh": str(o.mesh),
        "GiB/chip": f"{o.memory_per_chip / GIB:,.1f}/{o.hbm_per_chip / GIB:,.0f}" + ("" if o.fits else " (too big)"),
        "bound": o.bound,
    }
    if isinstance(p.workload, Training):
        row.update({
            "step": _human_time(o.step_seconds), "total": _human_time(o.total_seconds),
            "$/hour": _money(o.usd_per_hour), "$/1M tokens": _money(o.usd_per_million_tokens),
            "cost": _money(o.cost_usd), "spot cost": _money(o.spot_cost_usd),
        })
    else:
        row.update({
            "decode step": _human_time(o.step_seconds), "tokens/s": f"{o.tokens_per_second:,.0f}",
            "prefill": _human_time(o.prefill_seconds), "$/hour": _money(o.usd_per_hour),
            "$/1M tokens": _money(o.usd_per_million_tokens),
        })
    return row


def _summary_lines(p: Plan) -> list[str]:
    m, w = p.model, p.workload
    lines = [f"{m.name}: {_human_count(m.params)} params"
             + (f" ({_human_count(m.active_params)} active)" if m.experts > 1 else "")
             + (f", {_human_count(p.trainable_params)} trainable (LoRA r={w.lora_rank})" if isinstance(w, Training) and w.lora_rank else "")]
    if isinstance(w, Training):
        lines.append(
            f"train: {w.batch_tokens:,.0f} tokens/step x seq {w.seq_len}, {w.optimizer} "
            f"({w.param_dtype} params, {w.optimizer_dtype} state), remat {w.remat}, target MFU {w.mfu:.0%}"
            + (f", {_human_count(w.tokens)} tokens total" if w.tokens else "")
        )
    else:
        lines.append(f"serve: {w.weight_dtype} weights, batch {w.batch} x context {w.context}, KV {w.kv_cache_dtype}")
    mem = p.memory
    parts = [(k, v) for k, v in dataclasses.asdict(mem).items() if v]
    lines.append("memory: " + ", ".join(f"{k} {v / GIB:,.1f}" for k, v in parts) + f" = {mem.total / GIB:,.1f} GiB")
    flops = f"FLOPs: {p.flops_per_token:.3g}/token, {p.flops_per_step:.3g}/step"
    if p.total_flops:
        flops += f", {p.total_flops:.3g} total"
    lines.append(flops)
    return lines


def _render_text(p: Plan) -> str:
    rows = [_display_row(o, p) for o in p.options]
    lines = _summary_lines(p)
    if rows:
        cols = list(rows[0])
        widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
        lines.append("  ".join(c.ljust(widths[c]) for c in cols))
        lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    if any(o.fits for o in p.options):
        best = p.best()
        lines.append(f"cheapest: {best.accelerator} ({best.mesh}), {best.bound}-bound: {best.reason}")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def _render_html(p: Plan) -> str:
    import html

    summary = "".join(f"<li>{html.escape(s)}</li>" for s in _summary_lines(p))
    rows = [_display_row(o, p) for o in p.options]
    table = "<p>no slice fits</p>"
    if rows:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r.values()) + "</tr>" for r in rows)
        table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    extra = ""
    if any(o.fits for o in p.options):
        best = p.best()
        extra = f"<p><b>cheapest</b>: {html.escape(best.accelerator)} ({html.escape(str(best.mesh))}), {best.bound}-bound: {html.escape(best.reason)}</p>"
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in p.notes)
    return f"<div class='tpunb-plan'><ul>{summary}</ul>{table}{extra}<ul>{notes}</ul></div>"
