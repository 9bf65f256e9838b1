"""What ``%tpu_bench`` measured: one summary per level under ``vllm bench serve``'s key names, with
a table, a plot of latency against throughput for a sweep, and vLLM's files.

The files are those of vLLM v0.34.0 (commit 62d4bc3c7): one level is one result JSON as
``vllm bench serve --save-result --save-detailed --percentile-metrics ttft,tpot,itl,e2el`` writes it
(``vllm/benchmarks/serve.py``: the run's settings, then the figures and the per-request lists); a
sweep saved to a folder is the experiment folder of ``vllm bench sweep serve``
(``vllm/benchmarks/sweep/serve.py``): ``BENCH--max_concurrency=C/run=0.json`` per level (the folder
is vLLM's "-".join(("BENCH-", "max_concurrency=C")); its result with ``run_number`` and the level's
``max_concurrency``), ``summary.json`` beside it (the list of its runs) and ``summary.csv`` over all
of them, which ``vllm bench sweep plot`` reads. ``EXTRA_KEYS`` are tpunb's own, beside vLLM's
(tests/fixtures/vllm_bench holds a sweep vLLM's own code wrote, to compare with).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

from tpunb.errors import UsageError

#: the table's columns: (vllm's key, the column's title)
COLUMNS = (("completed", "completed"), ("failed", "failed"),
           ("request_throughput", "req/s"), ("output_throughput", "out tok/s"),
           ("mean_ttft_ms", "mean TTFT ms"), ("median_ttft_ms", "median TTFT ms"), ("p99_ttft_ms", "p99 TTFT ms"),
           ("mean_tpot_ms", "mean TPOT ms"), ("median_tpot_ms", "median TPOT ms"), ("p99_tpot_ms", "p99 TPOT ms"),
           ("mean_itl_ms", "mean ITL ms"), ("median_itl_ms", "median ITL ms"), ("p99_itl_ms", "p99 ITL ms"),
           ("mean_e2el_ms", "mean E2EL ms"), ("median_e2el_ms", "median E2EL ms"), ("p99_e2el_ms", "p99 E2EL ms"))
#: columns shown when the level has them: queue time under a cap, time to the first answer token
OPTIONAL = (("request_goodput", "goodput req/s"), ("median_client_queue_time_ms", "median queue ms"),
            ("median_ttfat_ms", "median first answer ms"))
#: per-request lists vllm also saves; left out of the table
LISTS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
         "generated_texts", "errors")
#: tpunb's keys beside vllm's in a saved result: its own, the time to the first answer token (when
#: reasoning came first), and the queue figures vllm names alike but saves only when
#: --percentile-metrics asks for them
EXTRA_KEYS = ("base_url", "rtt_ms", "on_host", "failures", "prefix_cache", "warmups", "seed") + tuple(
    f"{stat}_{name}_ms" for name in ("ttfat", "client_queue_time", "e2el_including_client_queue")
    for stat in ("mean", "median", "std", "p99"))


@dataclasses.dataclass
class BenchResult:
    """``levels``: one dict per level (vllm's keys, ``failures`` per kind, ``prefix_cache``: what
    the reset before it said); ``rtt_ms``: the round trip to the server measured beside them
    (None when run on its host)."""

    target: str
    model: str
    levels: list[dict]
    rtt_ms: float | None
    on_host: bool
    url: str
    chat: bool = False
    tokenizer: str | None = None
    requests: int = 0
    burstiness: float = 1.0
    seed: int = 0

    def frame(self):
        """One row per level: throughput, TTFT, TPOT, ITL, E2EL, failures and the round trip."""
        import pandas as pd

        optional = [(k, t) for k, t in OPTIONAL if any(level.get(k) is not None for level in self.levels)]
        rows = []
        for level in self.levels:
            row = {"concurrency": level["max_concurrency"] or "none"}
            row.update({title: level[key] for key, title in COLUMNS})
            row.update({title: level.get(key) for key, title in optional})
            row["failures"] = ", ".join(f"{kind}: {n}" for kind, n in sorted(level["failures"].items())) or ""
            if self.rtt_ms is not None:
                row["RTT ms"] = self.rtt_ms
            rows.append(row)
        table = pd.DataFrame(rows).set_index("concurrency").round(2)
        table.attrs.update(target=self.target, model=self.model, on_host=self.on_host)
        return table

    def entry(self, level: dict) -> dict:
        """One level as vllm saves a run: its settings first, then its figures, then tpunb's keys."""
        head = {"date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
                "endpoint_type": self.backend, "backend": self.backend, "label": None, "model_id": self.model,
                "tokenizer_id": self.tokenizer or self.model, "num_prompts": self.requests,
                "request_rate": level["request_rate"], "burstiness": self.burstiness,
                "max_concurrency": level["max_concurrency"]}
        return {**head, **level, "base_url": self.url, "rtt_ms": self.rtt_ms, "on_host": self.on_host,
                "seed": level.get("seed", self.seed)}

    @property
    def backend(self) -> str:
        return "openai-chat" if self.chat else "openai"

    def to_json(self) -> str:
        """The first level as vllm saves a result (a sweep's others: ``save`` to a folder)."""
        return json.dumps(self.entry(self.levels[0]))

    @staticmethod
    def check_place(path: str | Path, sweep: bool) -> Path:
        """Where ``save`` writes, refused in one line before a run when it is the wrong kind."""
        where = Path(path).expanduser()
        if not sweep and where.is_dir():
            raise UsageError(f"--save {path} is a folder: one level is saved as a file (a sweep, as a folder)")
        if sweep and where.exists() and not where.is_dir():
            raise UsageError(f"--save {path} is a file: a sweep is saved as a folder (vllm bench sweep's layout)")
        return where

    def save(self, path: str | Path) -> Path:
        """One level: a result JSON at ``path``. A sweep: vllm's experiment folder at ``path``."""
        where = self.check_place(path, len(self.levels) > 1)
        if len(self.levels) == 1:
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_text(self.to_json())
            return where
        runs = []
        for level in self.levels:
            run = {**self.entry(level), "run_number": 0, "max_concurrency": level["max_concurrency"]}
            folder = where / f"BENCH--max_concurrency={level['max_concurrency']}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "run=0.json").write_text(json.dumps(run, indent=4))
            (folder / "summary.json").write_text(json.dumps([run], indent=4))
            runs.append(run)
        import pandas as pd

        pd.DataFrame.from_records(runs).to_csv(where / "summary.csv")
        return where

    def failures_line(self) -> str:
        """One line per level that had failures, each kind with its count and first message."""
        lines = []
        for level in self.levels:
            if level["failures"]:
                kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(level["failures"].items()))
                first = next(e for e in level["errors"] if e)
                lines.append(f"concurrency {level['max_concurrency'] or 'none'}: {level['failed']} of "
                             f"{level['completed'] + level['failed']} failed ({kinds}); first: {first}")
        return "\n".join(lines)

    def plot(self, ax=None):
        """Median TTFT and TPOT against output throughput, a point per level (matplotlib); None
        without matplotlib."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4))
        x = [level["output_throughput"] for level in self.levels]
        for key, label in (("median_ttft_ms", "median TTFT"), ("median_tpot_ms", "median TPOT")):
            ax.plot(x, [level[key] for level in self.levels], marker="o", label=label)
        for level, at in zip(self.levels, x):
            ax.annotate(f"c={level['max_concurrency'] or 'none'}", (at, level["median_ttft_ms"]),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel("ms")
        ax.set_title(f"{self.model} at {self.target}")
        ax.legend()
        return ax

    def _repr_html_(self) -> str:
        return self.frame().to_html(float_format=lambda v: f"{v:.2f}")

    def __repr__(self) -> str:
        return self.frame().to_string(float_format=lambda v: f"{v:.2f}")
