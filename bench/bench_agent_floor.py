"""The floor under the pod-scale cell (issue 15): what waking N Python processes once a cell costs
on this machine, whatever tpunb does. A 30-line stand-in for the agent reads a request frame,
runs ``pass`` and writes a ``done`` frame: JSON frames and the cell compiled on the host, on one
thread or with a reader thread that hands the request to the main thread on a
``queue.SimpleQueue`` (tpunb's agent before the fourth step); or, as tpunb's agent now, on one
thread with ``marshal`` frames and the cell compiled once by the kernel. A bare kernel writes the
request to every process and waits for every reply.

    python bench/bench_agent_floor.py [--hosts 256] [--runs 200]

No tpunb code runs here: it bounds what any agent of that shape can reach on these cores.
"""
from __future__ import annotations

import argparse
import json
import marshal
import os
import selectors
import statistics
import struct
import subprocess
import sys
import time

HEADER = struct.Struct("!II")

AGENT = r'''
import ast, json, os, queue, struct, sys, threading
H = struct.Struct("!II")
buf = bytearray()
def read_exact(n):
    global buf
    while len(buf) < n:
        chunk = os.read(0, 65536)
        if not chunk:
            os._exit(0)
        buf += chunk
    out = bytes(buf[:n]); del buf[:n]; return out
def recv():
    json_len, _ = H.unpack(read_exact(8)); return json.loads(read_exact(json_len))
encoder = json.JSONEncoder(separators=(",", ":"))
namespace = {}
def run(message):
    exec(compile(ast.parse(message["code"], "<cell>"), "<cell>", "exec"), namespace)
    body = encoder.encode({"op": "done", "id": message["id"], "status": "ok"}).encode()
    os.write(1, H.pack(len(body), 0) + body)
if sys.argv[1] == "single":
    while True:
        run(recv())
if sys.argv[1] == "marshal":
    import marshal
    while True:
        json_len, blob_len = H.unpack(read_exact(8))
        message, code = marshal.loads(read_exact(json_len)), marshal.loads(read_exact(blob_len))
        exec(code, namespace)
        body = marshal.dumps({"op": "done", "id": message["id"], "status": "ok"})
        os.write(1, H.pack(len(body), 0) + body)
requests = queue.SimpleQueue()
def reader():
    while True:
        requests.put(recv())
threading.Thread(target=reader, daemon=True).start()
while True:
    run(requests.get())
'''


def cpu_seconds(pids: list[int]) -> float:
    """On-CPU time of every thread of these processes (schedstat: exact, not tick-sampled)."""
    total = 0
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    return total / 1e9


def measure(hosts: int, mode: str, runs: int) -> tuple[float, float, float]:
    procs = [subprocess.Popen([sys.executable, "-c", AGENT, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              bufsize=0) for _ in range(hosts)]
    selector = selectors.DefaultSelector()
    for proc in procs:
        selector.register(proc.stdout, selectors.EVENT_READ)

    def cell(rid: int) -> None:
        if mode == "marshal":
            body, blob = marshal.dumps({"op": "exec", "id": rid, "code": "pass"}), marshal.dumps(compile("pass", "<cell>", "exec"))
        else:
            body, blob = json.dumps({"op": "exec", "id": rid, "code": "pass"}).encode(), b""
        frame = HEADER.pack(len(body), len(blob)) + body + blob
        for proc in procs:
            os.write(proc.stdin.fileno(), frame)
        left = hosts
        while left:
            for key, _ in selector.select():
                os.read(key.fileobj.fileno(), 65536)  # one small done frame per read here
                left -= 1

    try:
        for rid in range(20):
            cell(rid)
        pids = [p.pid for p in procs]
        agents, kernel, samples = cpu_seconds(pids), time.process_time(), []
        for rid in range(runs):
            started = time.perf_counter()
            cell(rid)
            samples.append(time.perf_counter() - started)
        agents = (cpu_seconds(pids) - agents) / runs / hosts
        kernel = (time.process_time() - kernel) / runs / hosts
        return statistics.median(samples), agents, kernel
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=256)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, {args.hosts} processes, {args.runs} cells\n")
    print("| agent shape | p50 | agent CPU per cell and host | kernel CPU per cell and host |")
    print("|---|---|---|---|")
    for mode, label in (("single", "one thread, JSON, compiled on the host"),
                        ("thread", "reader thread + main thread, JSON, compiled on the host (tpunb's agent before)"),
                        ("marshal", "one thread, marshal, compiled by the kernel (tpunb's agent now)")):
        p50, agents, kernel = measure(args.hosts, mode, args.runs)
        print(f"| {label} | {p50 * 1e3:.1f} ms | {agents * 1e6:.0f} us | {kernel * 1e6:.0f} us |", flush=True)


if __name__ == "__main__":
    main()
