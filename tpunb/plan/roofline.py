"""One workload on one slice: the book's sharding formulas and a roofline per candidate mesh.

For each mesh (data x FSDP x tensor) it puts memory per chip next to usable HBM and compares
compute, HBM and ICI time, as "How to Scale Your Model" does; the slowest is the step time,
and the best fitting mesh gives the slice's :class:`SliceEstimate`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tpunb import catalog
from tpunb.catalog import Accelerator
from tpunb.plan.models import ModelSpec
from tpunb.plan.quantities import GIB, human_time, dtype_bytes
from tpunb.plan.workloads import Memory, Serving, Training, Workload

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


def evaluate(model: ModelSpec, w: Workload, acc: Accelerator, memory: Memory, reserve: float) -> SliceEstimate:
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
        f"per step at peak: compute {human_time(t_math)}, ICI {human_time(best.t_ici)}, HBM {human_time(best.t_hbm)}; "
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
        f"per decode step at peak: HBM {human_time(best.t_hbm)} (weights + KV, "
        f"{(memory.params + best.batch * kv_per_seq) / best.mesh.tensor / GIB:,.2f} GiB/chip), "
        f"compute {human_time(best.t_math)}, ICI {human_time(best.t_ici)}; batch {best.batch}/replica vs "
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


def custom_slice(tpu: str | Accelerator, chips: int | None, topology: str | None) -> Accelerator:
    """A catalog slice, or a generation at any chip count/topology (e.g. the book's v5p 16x20x28)."""
    if isinstance(tpu, Accelerator):
        return tpu
    if chips is None and topology is None:
        return catalog.lookup(tpu)
    return catalog.hypothetical(tpu, topology=topology, chips=chips)
