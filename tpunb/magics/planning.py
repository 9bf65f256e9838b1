"""``%tpu_catalog`` and ``%tpu_plan``: the catalog and the planner, one line each.

The magics only parse arguments; :mod:`tpunb.catalog` and :mod:`tpunb.plan` do the work, so
anything a magic shows is one Python call away.
"""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from tpunb import catalog
from tpunb.errors import UsageError
from tpunb.plan import Plan, plan

# Options that only make sense for one kind of workload: flag -> (workload, keyword).
_TRAIN_ONLY = {
    "seq": "seq_len", "tokens": "tokens", "optimizer": "optimizer", "param_dtype": "param_dtype",
    "opt_dtype": "optimizer_dtype", "remat": "remat", "microbatches": "microbatches",
    "lora": "lora_rank", "lora_targets": "lora_targets",
}
_SERVE_ONLY = {"weights": "weight_dtype", "context": "context", "kv_dtype": "kv_dtype", "output_tokens": "output_tokens"}


def _parse(magic: Any, line: str) -> Any:
    """parse_argstring, with IPython's usage errors turned into tpunb's one-line UsageError."""
    try:
        return parse_argstring(magic, line)
    except IPythonUsageError as e:
        name = magic.__name__
        raise UsageError(f"%{name}: {e}; see %{name}? for the options") from None
    except SystemExit:  # argparse --help already printed the usage
        return None


@magics_class
class PlanMagics(Magics):
    """Magics that answer "which TPU, how long, how much" before anything is launched."""

    @magic_arguments()
    @argument("filter", nargs="*", help="generations (v5e), zones or regions (us-east5), or slice names (v4-32)")
    @line_magic
    def tpu_catalog(self, line: str = "") -> Any:
        """Every Cloud TPU slice: shape, hosts, per-chip specs, prices, zones (a DataFrame).

        Examples: ``%tpu_catalog``, ``%tpu_catalog v6e``, ``%tpu_catalog v5e v6e us-east5``.
        """
        args = _parse(self.tpu_catalog, line)
        if args is None:
            return None
        return catalog.table(" ".join(args.filter) or None)

    @magic_arguments()
    @argument("model", help="preset (llama3-8b, gemma2-9b...), config.json path, or a parameter count (7B)")
    @argument("--serve", action="store_true", help="plan serving instead of training")
    @argument("--tpu", help="generations or slices to consider, comma separated (default: all)")
    @argument("--spot", action="store_true", help="rank options by spot price")
    @argument("--deadline", help="training must finish within this (36h, 30d, 2w; a unit is required)")
    @argument("--reserve", type=float, default=0.1, help="share of HBM kept free (default 0.1)")
    @argument("--batch", help="training: tokens per step (1M, 2^20); serving: concurrent sequences")
    @argument("--mfu", type=float, help="target model FLOPs utilisation (train 0.4, serve prefill 0.5)")
    @argument("--seq", help="training sequence length")
    @argument("--tokens", help="total training tokens (10B, 1.5T)")
    @argument("--optimizer", help="adamw, adam, adafactor, lion, momentum or sgd")
    @argument("--param-dtype", help="parameter dtype (bf16, fp32)")
    @argument("--opt-dtype", help="optimizer state dtype (fp32, bf16)")
    @argument("--master-weights", action="store_true", help="keep an fp32 master copy of bf16 params")
    @argument("--remat", help="checkpoint policy: full, ffw, dots, none, or checkpoints per layer")
    @argument("--microbatches", help="gradient accumulation steps per optimizer step")
    @argument("--lora", help="LoRA rank (fine-tune adapters only)")
    @argument("--lora-targets", help="LoRA matrices, e.g. q,v or q,k,v,o,gate,up,down")
    @argument("--weights", help="serving weight dtype: bf16, int8, fp8, int4")
    @argument("--context", help="serving context length per sequence (KV cache)")
    @argument("--kv-dtype", help="KV cache dtype (default: the weight dtype)")
    @argument("--output-tokens", help="median generated tokens per request")
    @line_magic
    def tpu_plan(self, line: str = "") -> Plan | None:
        """Memory, FLOPs, time and cost of training or serving a model on every TPU generation.

        Examples::

            %tpu_plan llama3-8b --batch 1M --seq 8192 --tokens 10B
            %tpu_plan gemma2-9b --lora 16 --batch 64K --seq 2048 --tokens 200M --tpu v5e,v6e
            %tpu_plan llama3-70b --serve --weights int8 --batch 32 --context 8192
        """
        args = _parse(self.tpu_plan, line)
        if args is None:
            return None
        given = {k: v for k, v in vars(args).items() if v not in (None, False)}
        wrong = _SERVE_ONLY if not args.serve else _TRAIN_ONLY
        misplaced = [k for k in wrong if k in given]
        if misplaced:
            flag = "--" + misplaced[0].replace("_", "-")
            mode = "serving (--serve)" if not args.serve else "training"
            raise UsageError(f"%tpu_plan: {flag} applies to {mode} only")
        options = {kw: given[k] for k, kw in (_SERVE_ONLY if args.serve else _TRAIN_ONLY).items() if k in given}
        if args.batch is not None:
            options["batch" if args.serve else "batch_tokens"] = args.batch
        if args.mfu is not None:
            options["mfu"] = args.mfu
        if args.master_weights:
            options["master_weights"] = True
        return plan(
            args.model, "serve" if args.serve else "train", tpu=args.tpu, spot=args.spot,
            deadline=args.deadline, hbm_reserve=args.reserve, **options,
        )
