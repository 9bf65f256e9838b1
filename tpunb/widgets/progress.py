"""Progress bars for long copies: tqdm.auto, so rate and ETA, the notebook widget in every front
end with widgets (JupyterLab, Notebook, VS Code, Colab) and a text bar in terminals."""
from __future__ import annotations

import contextlib
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
