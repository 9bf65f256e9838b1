"""What a job does with a model, and the memory that takes for the whole job.

:class:`Training` and :class:`Serving` check their options when built, so a bad option fails
at once with one line; :class:`Memory` is the job's bytes by component, before any sharding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from tpunb.errors import UsageError
from tpunb.plan.models import LORA_TARGETS, ModelSpec, lora_params
from tpunb.plan.quantities import dtype_bytes

# Optimizer state elements kept per trainable parameter (the master fp32 copy is separate).
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "lion": 1, "momentum": 1, "sgd": 0, "adafactor": 0}
REMAT_POLICIES = ("full", "ffw", "dots", "none")


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
        require(self.optimizer.lower() in OPTIMIZER_STATES, f"unknown optimizer {self.optimizer!r}: use one of {', '.join(OPTIMIZER_STATES)}")
        dtype_bytes(self.param_dtype), dtype_bytes(self.optimizer_dtype)
        require(isinstance(self.remat, int) and self.remat > 0 or self.remat in REMAT_POLICIES,
               f"unknown remat policy {self.remat!r}: use {', '.join(REMAT_POLICIES)} or a number of d_model-sized checkpoints per layer")
        require(0 < self.mfu <= 1, f"mfu must be in (0, 1], not {self.mfu}")
        require(self.batch_tokens >= self.seq_len > 0, f"batch of {self.batch_tokens:.0f} tokens is smaller than one sequence of {self.seq_len}")
        require(self.microbatches >= 1, "microbatches must be at least 1")
        require(self.lora_rank is None or self.lora_rank >= 1, "lora_rank must be at least 1")
        bad = [t for t in self.lora_targets if t not in LORA_TARGETS]
        require(not bad, f"unknown LoRA targets {bad}: use some of {', '.join(LORA_TARGETS)}")


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
        require(self.batch >= 1 and self.context >= 1, "batch and context must be at least 1")
        require(0 < self.mfu <= 1, f"mfu must be in (0, 1], not {self.mfu}")

    @property
    def kv_cache_dtype(self) -> str:
        return self.kv_dtype or self.weight_dtype

    @property
    def prompt_tokens(self) -> int:
        return max(1, self.context - self.output_tokens)


Workload = Union[Training, Serving]


def require(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(message)


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


def train_memory(model: ModelSpec, w: Training) -> tuple[Memory, float]:
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


def serve_memory(model: ModelSpec, w: Serving) -> Memory:
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
