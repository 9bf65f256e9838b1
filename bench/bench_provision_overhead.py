"""How long a launch spends in tpunb's own code rather than waiting on the Cloud TPU API.

Runs ``python -m tpunb.sandbox`` in a subprocess and launches slices against it with
tpunb.provision.gcp.create (create + wait for READY/ACTIVE). Every HTTP request is timed
(google.auth's AuthorizedSession.request) and so is every deliberate poll wait (shared.pause);
tpunb's overhead is the wall time minus both: request building, response parsing, state
tracking, error checks. Target: under 200 ms per launch.

    python bench/bench_provision_overhead.py [--runs 20] [--create-seconds 0.5] [--append]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Provisioning (issue 4)"
sys.path.insert(0, str(ROOT))


class Meter:
    """Seconds spent inside HTTP requests and inside poll waits, plus a request count."""

    def __init__(self) -> None:
        self.http = self.waits = 0.0
        self.requests = 0

    def reset(self) -> None:
        self.__init__()

    def install(self) -> None:
        from google.auth.transport.requests import AuthorizedSession

        from tpunb.provision.gcp import shared

        request, sleep = AuthorizedSession.request, shared.pause

        def timed_request(session, *args, **kwargs):
            started = time.perf_counter()
            try:
                return request(session, *args, **kwargs)
            finally:
                self.http += time.perf_counter() - started
                self.requests += 1

        def timed_sleep(seconds: float) -> None:
            started = time.perf_counter()
            sleep(seconds)
            self.waits += time.perf_counter() - started

        AuthorizedSession.request = timed_request
        shared.pause = timed_sleep


def launch(meter: Meter, name: str, queued: bool) -> dict:
    from tpunb.provision.gcp.tpu import api as gcp

    meter.reset()
    started = time.perf_counter()
    gcp.create(
        gcp.NodeSpec(
            name,
            "v4-16",
            "bench",
            "us-central2-b",
            queued=queued,
            ssh_user="bench",
            ssh_public_key="ssh-ed25519 AAAAbench bench",
        )
    )
    wall = time.perf_counter() - started
    row = {
        "wall": wall,
        "http": meter.http,
        "waits": meter.waits,
        "requests": meter.requests,
        "overhead": wall - meter.http - meter.waits,
    }
    gcp.delete("bench", "us-central2-b", name)
    return row


def start_emulator(create_seconds: float) -> tuple[subprocess.Popen, str]:
    from tpunb.sandbox import start_emulator_process

    flags = ["--create-seconds", str(create_seconds), "--queue-seconds", str(create_seconds / 2)]
    return start_emulator_process(*flags, "--delete-seconds", "0.05", cwd=ROOT)


def ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def summarise(label: str, rows: list[dict]) -> str:
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    worst = max(r["overhead"] for r in rows)
    return (
        f"| {label} | {len(rows)} | {ms(med['wall'])} | {ms(med['http'])} ({med['requests']:.0f} req) | "
        f"{ms(med['waits'])} | **{ms(med['overhead'])}** | {ms(worst)} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--create-seconds", type=float, default=0.5)
    parser.add_argument("--append", action="store_true", help="append the table to BENCHMARKS.md")
    args = parser.parse_args()

    proc, url = start_emulator(args.create_seconds)
    os.environ["TPUNB_TPU_API_ENDPOINT"] = url
    try:
        started = time.perf_counter()
        import google.cloud.tpu_v2  # noqa: F401  (what a kernel's first gcp launch imports)

        import_seconds = time.perf_counter() - started
        meter = Meter()
        meter.install()
        first = launch(meter, "first", queued=False)
        nodes = [launch(meter, f"n{i}", queued=False) for i in range(args.runs)]
        queued = [launch(meter, f"q{i}", queued=True) for i in range(args.runs)]
    finally:
        proc.terminate()
        proc.wait()

    header = (
        "| launch | runs | wall ms (median) | in HTTP ms | in poll waits ms | tpunb overhead ms (median) "
        "| overhead ms (worst) |\n|---|---|---|---|---|---|---|"
    )
    table = "\n".join(
        [
            header,
            summarise("first in the process (client creation, first connection)", [first]),
            summarise("node, v4-16 (2 hosts)", nodes),
            summarise("queued resource, v4-16", queued),
        ]
    )
    note = (
        f"Importing google-cloud-tpu once per kernel: {ms(import_seconds)} ms (outside the table; "
        "`%load_ext tpunb` starts it on a background thread)."
    )
    print(table + "\n\n" + note)
    if args.append:
        command = "python bench/bench_provision_overhead.py"
        command += f" --runs {args.runs} --create-seconds {args.create_seconds} --append"
        append_to_section(
            ROOT / "BENCHMARKS.md",
            SECTION,
            f"`{command}` ({time.strftime('%Y-%m-%d')}, emulator in a subprocess, {args.create_seconds} s "
            f"in CREATING, polling every 20 ms, {os.cpu_count()} CPUs):\n\n{table}\n\n{note}\n",
        )


def append_to_section(path: Path, header: str, text: str) -> None:
    """Add ``text`` at the end of the ``header`` section of a markdown file (made if absent)."""
    content = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    if header not in content:
        content = content.rstrip("\n") + f"\n\n{header}\n"
    start = content.index(header) + len(header)
    following = content.find("\n## ", start)
    end = len(content) if following < 0 else following + 1
    section = content[start:end].rstrip("\n") + "\n\n" + text
    path.write_text(
        content[:start] + section + ("\n" + content[end:] if following >= 0 else ""), encoding="utf-8"
    )


if __name__ == "__main__":
    main()
