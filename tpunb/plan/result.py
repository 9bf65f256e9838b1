"""What :func:`tpunb.plan.plan` worked out, a :class:`Plan`, and how people read it: text, HTML
and rows for DataFrames.

Kept apart from the estimator so changing how a plan looks never touches what it computes.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpunb.catalog import Accelerator
from tpunb.errors import UsageError
from tpunb.plan.models import ModelSpec
from tpunb.plan.roofline import SliceEstimate, custom_slice, evaluate
from tpunb.plan.quantities import GIB, human_count, human_time, money
from tpunb.plan.workloads import Memory, Training, Workload, require

if TYPE_CHECKING:
    import pandas


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
        require(by in ("cost", "time"), f"best(by=...) takes 'cost' or 'time', not {by!r}")
        fitting = [o for o in self.options if o.fits]
        if not fitting:
            raise UsageError("no slice considered holds this workload: shrink the batch, use remat, LoRA or more chips")
        if by == "time":
            return min(fitting, key=lambda o: o.step_seconds)
        priced = [o for o in fitting if _option_cost(o, self) is not None]
        return min(priced or fitting, key=lambda o: _option_cost(o, self) or math.inf)

    def on(self, tpu: str | Accelerator, chips: int | None = None, topology: str | None = None) -> SliceEstimate:
        """This workload on one given slice (``"v5p-128"``) or any chip count of a generation."""
        acc = custom_slice(tpu, chips, topology)
        return evaluate(self.model, self.workload, acc, self.memory, self.hbm_reserve)

    def table(self) -> "pandas.DataFrame":
        """The options as a DataFrame, one row per slice."""
        import pandas

        rows = [option_row(o, self) for o in self.options]
        return pandas.DataFrame(rows).set_index("slice") if rows else pandas.DataFrame()

    def memory_table(self) -> "pandas.DataFrame":
        """Memory by component, in GiB."""
        import pandas

        rows = {k: v / GIB for k, v in dataclasses.asdict(self.memory).items()}
        rows["total"] = self.memory.total / GIB
        return pandas.DataFrame({"GiB": rows})

    def __str__(self) -> str:
        return render_text(self)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        return render_html(self)


def _option_cost(o: SliceEstimate, p: Plan) -> float | None:
    """What ranks options by money: USD per million tokens (trained or generated)."""
    per_hour = o.spot_usd_per_hour if p.spot else o.usd_per_hour
    return None if per_hour is None else per_hour / 3600 / o.tokens_per_second * 1e6



def option_row(o: SliceEstimate, p: Plan) -> dict[str, Any]:
    """One option as numbers (seconds, GiB, USD), for DataFrames that sort and plot."""
    row: dict[str, Any] = {
        "slice": o.accelerator, "generation": o.generation, "planning_only": _slice_name(o) != o.accelerator,
        "chips": o.chips, "devices": o.chips * _devices_per_chip(o), "hosts": o.hosts,
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


def _devices_per_chip(o: SliceEstimate) -> int:
    """JAX devices per chip: 2 on TPU7x (each chip's two TensorCores), so its mesh of chips is
    twice as many devices for jax.make_mesh."""
    from tpunb import catalog

    return catalog.generation(o.generation).devices_per_chip


def _slice_name(o: SliceEstimate) -> str:
    """The option's slice, marked when it can be planned for but not launched (tpu7x)."""
    from tpunb import catalog
    from tpunb.errors import UnknownAcceleratorError

    try:
        planning_only = catalog.lookup(o.accelerator).planning_only
    except UnknownAcceleratorError:  # a hypothetical shape: named by its topology
        planning_only = catalog.generation(o.generation).planning_only
    return f"{o.accelerator} (planning only)" if planning_only else o.accelerator


def _display_row(o: SliceEstimate, p: Plan) -> dict[str, str]:
    """One option as a person reads it."""
    row = {
        "slice": _slice_name(o), "chips": str(o.chips), "hosts": str(o.hosts),
        "mesh": str(o.mesh) + (f" (of chips: {_devices_per_chip(o)} JAX devices each)" if _devices_per_chip(o) > 1 else ""),
        "GiB/chip": f"{o.memory_per_chip / GIB:,.1f}/{o.hbm_per_chip / GIB:,.0f}" + ("" if o.fits else " (too big)"),
        "bound": o.bound,
    }
    if isinstance(p.workload, Training):
        row.update({
            "step": human_time(o.step_seconds), "total": human_time(o.total_seconds),
            "$/hour": money(o.usd_per_hour), "$/1M tokens": money(o.usd_per_million_tokens),
            "cost": money(o.cost_usd), "spot cost": money(o.spot_cost_usd),
        })
    else:
        row.update({
            "decode step": human_time(o.step_seconds), "tokens/s": f"{o.tokens_per_second:,.0f}",
            "prefill": human_time(o.prefill_seconds), "$/hour": money(o.usd_per_hour),
            "$/1M tokens": money(o.usd_per_million_tokens),
        })
    return row


def _summary_lines(p: Plan) -> list[str]:
    m, w = p.model, p.workload
    lines = [f"{m.name}: {human_count(m.params)} params"
             + (f" ({human_count(m.active_params)} active)" if m.experts > 1 else "")
             + (f", {human_count(p.trainable_params)} trainable (LoRA r={w.lora_rank})" if isinstance(w, Training) and w.lora_rank else "")]
    if isinstance(w, Training):
        lines.append(
            f"train: {w.batch_tokens:,.0f} tokens/step x seq {w.seq_len}, {w.optimizer} "
            f"({w.param_dtype} params, {w.optimizer_dtype} state), remat {w.remat}, target MFU {w.mfu:.0%}"
            + (f", {human_count(w.tokens)} tokens total" if w.tokens else "")
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


def render_text(p: Plan) -> str:
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


def render_html(p: Plan) -> str:
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
