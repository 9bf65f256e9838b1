"""Progress bars for long copies: tqdm.auto, so rate and ETA, the notebook widget in every front
end with widgets (JupyterLab, Notebook, VS Code, Colab) and a text bar in terminals."""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator


@contextlib.contextmanager
def byte_progress(description: str) -> Iterator[Callable[[int, int], None]]:
    """A bar for ``update(done_bytes, total_bytes)`` calls, shown at the first one (a copy that
    has nothing to do shows none) and closed when the block ends."""
    from tqdm.auto import tqdm

    bars: list = []

    def update(done: int, total: int) -> None:
        if not bars:
            # unit "iB" with divisor 1024: tqdm says MiB/s and GiB/s (with "B" it said MB/s for MiB/s)
            bars.append(tqdm(desc=description, unit="iB", unit_scale=True, unit_divisor=1024, total=total, leave=True))
        bar = bars[0]
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        for bar in bars:
            bar.close()


class SetupProgress:
    """One tqdm.auto bar while hosts' environments are made: it counts the steps done on every
    host, and its text says each host's step (``[0-1] packages: Resolved 48 packages · [2-3] venv``).
    Nothing is shown while hosts only check an environment that is already right."""

    def __init__(self, hosts: int, steps: tuple[str, ...], names=None) -> None:
        self.hosts, self.steps = hosts, steps
        self.names = names or (lambda group: ",".join(map(str, group)))
        self.state: dict[int, tuple[int, str, str]] = {}  # host -> (steps done, step, note)
        self._bar = None
        self._lock = threading.Lock()

    def update(self, host: int, message: dict) -> None:
        """A ``prepare`` frame from ``host`` (any thread)."""
        with self._lock:
            if message.get("state") == "ready":
                self.state[host] = (len(self.steps), "ready", "")
                if self._bar is None:
                    return  # only checked so far: nothing worth a bar
            elif message.get("state") == "step":
                index = int(message.get("index") or 0)
                self.state[host] = (index, str(message.get("step") or ""), str(message.get("note") or ""))
            else:
                return
            if self._bar is None:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=self.hosts * len(self.steps), desc=f"preparing {self.hosts} "
                                 f"host{'s' if self.hosts > 1 else ''}", unit="step", leave=True)
            done = sum(count for count, _, _ in self.state.values())
            self._bar.update(done - self._bar.n)
            self._bar.set_postfix_str(self.text(), refresh=True)

    def text(self) -> str:
        groups: dict[tuple[str, str], list[int]] = {}
        for host, (_, step, note) in sorted(self.state.items()):
            groups.setdefault((step, note if step != "ready" else ""), []).append(host)
        parts = []
        for (step, note), group in groups.items():
            parts.append(f"[{self.names(group)}] {step}" + (f": {note}" if note else ""))
        return " · ".join(parts)

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
