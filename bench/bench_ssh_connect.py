"""Connecting to 16 hosts from scratch: tpunb's connect_all vs parallel-ssh, same run.

Both connect and authenticate with the same ed25519 key to the same 16 sshd addresses
(tests/sshd.py), alternating, from nothing (tpunb with an empty TPUNB_HOME each time, so it also
records 16 host keys). A second row adds one trivial command on every host. Prints a markdown table.

    python bench/bench_ssh_connect.py [--hosts 16] [--repeat 5]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from gevent import joinall
from pssh.clients import ParallelSSHClient

from bench.bench_sync import print_table
from tests.sshd import Sshd, _write_ed25519
from concurrent.futures import ThreadPoolExecutor

from tpunb.transport.ssh_hosts import connect_all


def tpunb_connect(specs: list[str], key: Path, home: Path, command: bool) -> float:
    shutil.rmtree(home, ignore_errors=True)
    os.environ["TPUNB_HOME"] = str(home)
    started = time.perf_counter()
    transports = connect_all(specs, key_path=key)
    if command:
        def run_true(transport):
            channel = transport.open_command("true")
            return channel.recv_exit_status()

        with ThreadPoolExecutor(len(transports)) as pool:
            codes = list(pool.map(run_true, transports))
        assert set(codes) == {0}
    elapsed = time.perf_counter() - started
    for t in transports:
        t.close()
    return elapsed


def pssh_connect(sshd: Sshd, key: Path, command: bool) -> float:
    started = time.perf_counter()
    client = ParallelSSHClient(sshd.addresses, user=sshd.user, port=sshd.port, pkey=str(key),
                               num_retries=1, allow_agent=False, identity_auth=False)
    joinall(client.connect_auth(), raise_error=True)
    if command:
        output = client.run_command("true")
        client.join(output)
        assert {o.exit_code for o in output} == {0}
    elapsed = time.perf_counter() - started
    del client  # parallel-ssh closes its connections when the client is collected
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-connect-"))
    sshd = Sshd(hosts=args.hosts, directory=work / "sshd")
    try:
        key = work / "id_ed25519"
        sshd.authorize(_write_ed25519(key))
        specs = [f"{a}:{sshd.port}" for a in sshd.addresses]
        rows = {}
        for command in (False, True):
            tp, ps = [], []
            for _ in range(args.repeat):
                tp.append(tpunb_connect(specs, key, work / "home", command))
                ps.append(pssh_connect(sshd, key, command))
            rows["connect + auth" + (" + `true` on each" if command else "")] = (ps, tp)
        print_table(f"{args.hosts} hosts from scratch", args.repeat, "parallel-ssh", rows)
    finally:
        sshd.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
