"""The compile cache on a multi-host slice whose hosts keep it on their own disks: what each host
holds and hits, per host, before and after %tpu_restart copies process 0's entries to the others.

    python bench/bench_compile_cache_hosts.py [--hosts 2] [--layers 24]

Real OpenSSH sshd hosts on loopback addresses, each with a home of its own (its own disk for the
cache), this machine's Python and JAX on the CPU (4 devices a host, one jax.distributed job). One
SPMD program (a jitted value_and_grad of a ``--layers``-deep residual MLP over every host's
devices) runs in the first session, then again after ``%tpu_restart``. Per host: the cache's entries,
and the compiles that asked it, its hits and misses as JAX's monitoring events count them
(``Slice.compile_cache_stats``), and whether JAX's cache there returns each of host 0's entries by
host 0's key.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from tpunb import manager  # noqa: E402
from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519  # noqa: E402

CPU_AS_TPU_HOST = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
PROGRAM = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ('x',), axis_types=(jax.sharding.AxisType.Auto,))
def loss(ws, x):
    for w in ws:
        x = jax.nn.gelu(x @ w) + x
    return (x ** 2).mean()
ws = [jnp.full((256, 256), 0.01) for _ in range({layers})]
x = jax.device_put(jnp.ones((64, 256)), NamedSharding(mesh, P('x')))
jax.jit(jax.value_and_grad(loss))(ws, x)[0].block_until_ready()
"""
#: the cache's entries on this host, and how many of host 0's keys JAX's cache here returns
HELD = ("import os, jax\nfrom jax._src import compilation_cache as cc\nroot = os.environ['JAX_COMPILATION_CACHE_DIR']\n"
        "cache = cc._get_cache(jax.devices()[0].client)\n"
        "keys = [n[:-len('-cache')] for n in os.listdir(root) if n.endswith('-cache')]\n"
        "(len(keys), sum(cache.get(k) is not None for k in {keys!r}))")


def keys_of(folder: Path) -> list[str]:
    return sorted(p.name[:-len("-cache")] for p in folder.glob("*-cache"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-cache-home-"))
    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-cache-"))
    server = Sshd(hosts=args.hosts, directory=work / "sshd")
    key = work / "id_ed25519"
    server.authorize(write_ed25519(key))
    caches = [server.home(a) / ".tpunb/jax-cache" for a in server.addresses[:args.hosts]]
    rows = []
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            sl = manager.connect([f"{a}:{server.port}" for a in server.addresses[:args.hosts]], key=str(key),
                                 python=server.python, name="cached", env=CPU_AS_TPU_HOST)
        program = PROGRAM.format(layers=args.layers)
        for phase in ("first session", "after %tpu_restart"):
            if phase != "first session":
                restart_line = sl.restart().line(sl.name, sl.layout.names)
            sl.run(program, output=None).raise_for_status()
            stats = sl.compile_cache_stats()
            rows.append((phase, stats, [len(keys_of(c)) for c in caches]))
        written = keys_of(caches[0])
        held = sl.run(HELD.format(keys=written), output=None)
        found = {i: ast.literal_eval(r) for i, r in held.reprs.items()}
        manager.down("cached")
    finally:
        server.close()
    print(f"\n### One SPMD program ({args.layers} layers) on {args.hosts} sshd hosts, each its cache on its own disk\n")
    print("| session | host | entries on its disk | compiles that asked the cache | hits | misses | entries it wrote |")
    print("|---|---|---|---|---|---|---|")
    for phase, stats, entries in rows:
        for i in sorted(stats):
            s = stats[i]
            print(f"| {phase} | {i} | {entries[i]} | {s['requests']} | {s['hits']} | {s['misses']} | {s['written']} |")
    print(f"\n{restart_line}")
    print("JAX's cache on each host returns host 0's entries by host 0's key: "
          + ", ".join(f"host {i}: {n} of {len(written)}" for i, (_, n) in sorted(found.items())))


if __name__ == "__main__":
    main()
