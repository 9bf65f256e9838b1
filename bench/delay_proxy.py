"""A delayed link without netem: a TCP proxy that holds every chunk for ``delay`` seconds each way
and counts the bytes it carries (this machine's kernel has no sch_netem; see NOTES.md). With a
rate (``--mbit``), every connection shares one link of that many Mbit/s each way, as a notebook's
uplink is shared by all its hosts' connections: a chunk leaves once the link has carried the ones
before it, then takes the delay.

One listening port on 127.0.0.1 per target (a host's sshd). Run as a process:

    python bench/delay_proxy.py --delay 0.05 [--mbit 100] 127.0.0.2:2222 127.0.0.3:2222 ...

It prints one line of JSON, {"ports": [...]} (the listening port of each target, in order), then
answers each line read on stdin with {"up": bytes to the targets, "down": bytes back}.
``DelayProxy`` runs the same in a thread of the calling process.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time


class DelayProxy:
    """Listening ports in front of ``targets`` ([(host, port)]), each chunk delayed each way."""

    def __init__(self, targets: list[tuple[str, int]], delay: float, mbit: float = 0.0) -> None:
        self.targets, self.delay = targets, delay
        self.rate = mbit * 1e6 / 8  # bytes per second each way (0: no limit)
        self.free_at = {"up": 0.0, "down": 0.0}  # when each direction's link has carried what it holds
        self.up = self.down = 0
        self.ports: list[int] = []
        self.loop = asyncio.new_event_loop()

    def start(self) -> "DelayProxy":
        """Listen (in a thread of this process); returns once every port is open."""
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True, name="delay-proxy").start()
        ready.wait()
        return self

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._listen())
        ready.set()
        self.loop.run_forever()

    async def _listen(self) -> None:
        for target in self.targets:
            server = await asyncio.start_server(lambda r, w, t=target: self._connection(r, w, t), "127.0.0.1", 0)
            self.ports.append(server.sockets[0].getsockname()[1])

    async def _connection(self, reader, writer, target) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer, "up"), self._pipe(up_reader, writer, "down"))

    async def _pipe(self, reader, writer, direction: str) -> None:
        """Read as it comes; each chunk leaves ``delay`` seconds after it arrived, in order."""
        held: asyncio.Queue = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await held.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(send())
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                if direction == "up":
                    self.up += len(data)
                else:
                    self.down += len(data)
                held.put_nowait((self._leaves(direction, len(data)) + self.delay, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        held.put_nowait((0.0, None))
        try:
            await sender
        except OSError:
            pass


    def _leaves(self, direction: str, size: int) -> float:
        """When a chunk arriving now has crossed the shared link (now, with no rate)."""
        now = time.monotonic()
        if not self.rate:
            return now
        self.free_at[direction] = max(now, self.free_at[direction]) + size / self.rate
        return self.free_at[direction]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.05, help="seconds each way")
    parser.add_argument("--mbit", type=float, default=0.0, help="shared link rate each way (0: none)")
    parser.add_argument("targets", nargs="+", help="host:port of each target")
    args = parser.parse_args()
    targets = [(t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1])) for t in args.targets]
    proxy = DelayProxy(targets, args.delay, args.mbit).start()
    print(json.dumps({"ports": proxy.ports}), flush=True)
    for _ in sys.stdin:
        print(json.dumps({"up": proxy.up, "down": proxy.down}), flush=True)


if __name__ == "__main__":
    main()
