"""How big, how long, how much: memory, FLOPs, time and cost of a model on every TPU.

The method is the one of "How to Scale Your Model" (Austin et al., jax-ml/scaling-book):
count parameters and FLOPs from the config, put memory per component next to HBM, then
compare compute time with HBM and ICI time (a roofline) for each candidate mesh, and take
the slowest as the step time. Chip numbers and prices come from :mod:`tpunb.catalog`.

This module picks a slice per generation; the parts live beside it: ``units`` (reading and
printing quantities), ``models`` (model shapes), ``workloads`` (jobs and their memory),
``roofline`` (one slice, the book's formulas), ``result`` (the :class:`Plan` and how people read
it: tables and text) and ``magics`` (%tpu_plan). The names users need are exported here.

Estimates, not measurements: they ignore compiler overheads beyond the target MFU, assume
flash attention (no S x S score matrix in memory) and one slice (no DCN/multislice).
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
from typing import Any, Iterable, Mapping, Union

from tpunb import catalog
from tpunb.catalog import Accelerator
from tpunb.errors import UnknownAcceleratorError, UsageError
from tpunb.plan.models import (
    LORA_TARGETS, MODELS_PATH, ModelSpec, lora_params, preset, presets, resolve_model,
)
from tpunb.plan.result import Plan
from tpunb.plan.roofline import (
    Mesh, SliceEstimate, evaluate, fsdp_min_tokens_per_chip, fsdp_tp_split,
    hbm_intensity, ici_intensity, max_tensor_parallel, mixed_min_tokens_per_chip,
)
from tpunb.plan.quantities import DTYPE_BYTES, GIB, dtype_bytes, parse_count
from tpunb.units import parse_duration
from tpunb.plan.workloads import (
    OPTIMIZER_STATES, REMAT_POLICIES, Memory, Serving, Training, Workload, require, serve_memory,
    train_memory,
)

__all__ = [
    "plan", "Plan", "SliceEstimate", "Mesh", "Memory", "Training", "Serving", "Workload", "ModelSpec",
    "preset", "presets", "resolve_model", "lora_params", "dtype_bytes", "parse_count", "parse_duration",
    "ici_intensity", "hbm_intensity", "fsdp_min_tokens_per_chip", "max_tensor_parallel",
    "mixed_min_tokens_per_chip", "fsdp_tp_split", "GIB", "DTYPE_BYTES", "OPTIMIZER_STATES",
    "REMAT_POLICIES", "LORA_TARGETS", "MODELS_PATH",
]


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
    that holds the job (and, with ``deadline``, finishes in time: ``"36h"``, ``"7d"``, or a
    number of seconds). ``hbm_reserve`` is the share of HBM left for XLA scratch, fragmentation
    and the runtime.
    """
    spec = resolve_model(model)
    w = _make_workload(workload, options)
    require(0 <= hbm_reserve < 1, f"hbm_reserve must be in [0, 1), not {hbm_reserve}")
    deadline_s = parse_duration(deadline, "deadline") if deadline is not None else None
    if isinstance(w, Training):
        memory, trainable = train_memory(spec, w)
        dense, attn = spec.flops_per_token(w.seq_len, training=True)
        if w.lora_rank:
            dense *= 2 / 3
        per_step = (dense + attn) * w.batch_tokens
    else:
        memory, trainable = serve_memory(spec, w), 0.0
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
        require(not options, "pass either a Training/Serving object or keyword options, not both")
        return workload
    kinds = {"train": Training, "training": Training, "finetune": Training, "fine-tune": Training,
             "serve": Serving, "serving": Serving, "inference": Serving}
    cls = kinds.get(str(workload).lower())
    require(cls is not None, f"workload must be 'train' or 'serve', not {workload!r}")
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
            est = evaluate(model, w, acc, memory, reserve)
            last = est
            on_time = deadline is None or est.total_seconds is None or est.total_seconds <= deadline
            if est.fits and on_time:
                pick = est
                break
        if pick is None and len(accs) == 1:
            pick = last or evaluate(model, w, accs[0], memory, reserve)
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
