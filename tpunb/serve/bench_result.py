"""What ``%tpu_bench`` measured: one summary per concurrency level, under vllm ``bench serve``'s
key names, with a table, a plot of latency against throughput for a sweep, and JSON."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

#: the table's columns: (vllm's key, the column's title)
COLUMNS = (("concurrency", "concurrency"), ("completed", "completed"), ("failed", "failed"),
           ("request_throughput", "req/s"), ("output_throughput", "out tok/s"),
           ("mean_ttft_ms", "mean TTFT ms"), ("median_ttft_ms", "median TTFT ms"), ("p99_ttft_ms", "p99 TTFT ms"),
           ("mean_tpot_ms", "mean TPOT ms"), ("median_tpot_ms", "median TPOT ms"), ("p99_tpot_ms", "p99 TPOT ms"),
           ("mean_itl_ms", "mean ITL ms"), ("median_itl_ms", "median ITL ms"), ("p99_itl_ms", "p99 ITL ms"),
           ("mean_e2el_ms", "mean E2EL ms"), ("median_e2el_ms", "median E2EL ms"), ("p99_e2el_ms", "p99 E2EL ms"))
#: per-request lists vllm also saves; left out of the table
LISTS = ("input_lens", "output_lens", "ttfts", "itls", "errors")


@dataclasses.dataclass
class BenchResult:
    """``levels``: one dict per concurrency level (vllm's keys, plus ``failures`` per kind);
    ``rtt_ms``: the round trip to the server measured beside them (None when run on its host)."""

    target: str
    model: str
    levels: list[dict]
    rtt_ms: float | None
    on_host: bool
    url: str
    chat: bool = False

    def frame(self):
        """One row per concurrency level: throughput, TTFT, TPOT, ITL, E2EL and failures per kind."""
        import pandas as pd

        rows = []
        for level in self.levels:
            row = {title: level[key] for key, title in COLUMNS}
            row["failures"] = ", ".join(f"{kind}: {n}" for kind, n in sorted(level["failures"].items())) or ""
            if self.rtt_ms is not None:
                row["RTT ms"] = self.rtt_ms
            rows.append(row)
        table = pd.DataFrame(rows).set_index("concurrency").round(2)
        table.attrs.update(target=self.target, model=self.model, on_host=self.on_host)
        return table

    def to_json(self) -> str:
        """A JSON object as vllm saves it for one level; a list of them (one per level) for a sweep."""
        entries = [self._entry(level) for level in self.levels]
        return json.dumps(entries[0] if len(entries) == 1 else entries, indent=1)

    def _entry(self, level: dict) -> dict:
        return {**level, "model_id": self.model, "base_url": self.url,
                "backend": "openai-chat" if self.chat else "openai", "rtt_ms": self.rtt_ms, "on_host": self.on_host}

    def save(self, path: str | Path) -> Path:
        where = Path(path).expanduser()
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(self.to_json())
        return where

    def failures_line(self) -> str:
        """One line per level that had failures, each kind with its count and first message."""
        lines = []
        for level in self.levels:
            if level["failures"]:
                kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(level["failures"].items()))
                first = next(e for e in level["errors"] if e)
                lines.append(f"concurrency {level['concurrency']}: {level['failed']} of "
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
            ax.annotate(f"c={level['concurrency']}", (at, level["median_ttft_ms"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=8)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel("ms")
        ax.set_title(f"{self.model} at {self.target}")
        ax.legend()
        return ax

    def _repr_html_(self) -> str:
        return self.frame().to_html(float_format=lambda v: f"{v:.2f}")

    def __repr__(self) -> str:
        return self.frame().to_string(float_format=lambda v: f"{v:.2f}")
