"""%tpu_fetch against every host downloading at once: a model from the Hub to a slice whose hosts
each have their own link to the Hub, as TPU VMs each have their own NIC.

    python bench/bench_fetch.py [--mb 1024] [--files 4] [--hosts 4] [--mbit 400] [--delay 0.02] [--ssh-delay 0.02]

The source is the Hub stand-in (tpunb/sandbox/hub/hub_server.py, the real huggingface_hub client reads it).
Each host reaches it through a link of its own: a bench/delay_proxy.py pair (the Hub and its CDN,
``--delay`` s each way, ``--mbit`` Mbit/s each way per link, shared only by that host's
connections), whose LFS redirects stay on that link (``Hub.cdn_routes``). The hosts are real
OpenSSH sshd hosts on loopback addresses, each with a home of its own, reached by the kernel (this
process) through a proxy (``--ssh-delay`` s each way, no rate limit) that counts the bytes on the
kernel's link; the hosts reach each other directly, as a slice's hosts do. The model is
``--files`` safetensors shards of random bytes, ``--mb`` MiB in all, and a config.json.

1. tpunb: ``Slice.fetch("hf://org/big")`` into each host's Hugging Face cache: host 0 downloads on
   its own link (several GETs at once, large files in Range pieces) and relays to the others.
2. huggingface_hub: every host runs ``snapshot_download("org/big")`` at once, on its own link, into
   a cache of its own (``cache_dir``), as each host running ``from_pretrained`` would.
For each: wall seconds, the bytes each link carried from the Hub, bytes on the kernel's link.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from delay_proxy import DelayProxy  # noqa: E402

from tpunb import manager  # noqa: E402
from tpunb.sandbox.hub.hub_server import Hub, HubServer  # noqa: E402
from tpunb.sandbox.hosts.sshd import Sshd, write_ed25519  # noqa: E402

#: what every host runs for the baseline, its own link's address in HF_ENDPOINT (set before the import).
#: A connection may wait on its link longer than huggingface_hub's 10 s read timeout, raised here
BASELINE = ("import os\nos.environ['HF_ENDPOINT'] = {endpoints!r}[int(os.environ['TPUNB_HOST_INDEX'])]\n"
            "os.environ['HF_HUB_DISABLE_PROGRESS_BARS'] = '1'\nos.environ['HF_HUB_DOWNLOAD_TIMEOUT'] = '600'\n"
            "from huggingface_hub import snapshot_download\n"
            "snapshot_download('org/big', cache_dir=os.path.expanduser('~/hf-baseline'), token=False)\n'ok'")
#: the sha256 of every shard both ways, on every host
DIGESTS = ("import glob, hashlib, os\n[sorted(hashlib.sha256(open(p, 'rb').read()).hexdigest() for p in "
           "glob.glob(os.path.expanduser(f'~/{d}/models--org--big/snapshots/*/*.safetensors'))) "
           "for d in ('.cache/huggingface/hub', 'hf-baseline')]")


def links(hub: Hub, server: HubServer, hosts: int, delay: float, mbit: float) -> list[DelayProxy]:
    """A link per host: a proxy before the Hub and one before its CDN, the Hub's redirects kept on it."""
    origins = [tuple(u.removeprefix("http://").rsplit(":", 1)) for u in (server.url, hub.cdn_url)]
    made = []
    for _ in range(hosts):
        proxy = DelayProxy([(h, int(p)) for h, p in origins], delay, mbit).start()
        api, cdn = proxy.ports
        hub.cdn_routes[f"127.0.0.1:{api}"] = f"http://127.0.0.1:{cdn}"
        made.append(proxy)
    return made


def measure(what, source: list[DelayProxy], link: DelayProxy) -> tuple[float, list[int], int]:
    """(wall seconds, bytes each host's link carried from the Hub, bytes on the kernel's link) of ``what()``."""
    served, carried = [p.down for p in source], link.up + link.down
    started = time.perf_counter()
    what()
    return (time.perf_counter() - started, [p.down - s for p, s in zip(source, served)],
            link.up + link.down - carried)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=1024, help="the model's size in MiB")
    parser.add_argument("--files", type=int, default=4, help="safetensors shards it is cut in")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--mbit", type=float, default=400.0, help="each host's own link to the Hub, Mbit/s (0: none)")
    parser.add_argument("--delay", type=float, default=0.02, help="the Hub links' one-way delay, s")
    parser.add_argument("--ssh-delay", type=float, default=0.02, help="the kernel's link's one-way delay, s")
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-fetch-home-"))
    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-fetch-"))
    size = int(args.mb * (1 << 20))
    hub = Hub()
    shard = size // args.files
    files = {f"model-{i + 1:05d}-of-{args.files:05d}.safetensors": os.urandom(shard) for i in range(args.files)}
    hub.add_repo("org/big", {"config.json": b'{"hidden_size": 4096}', **files})
    size = shard * args.files
    server = Sshd(hosts=args.hosts, directory=work / "sshd")
    key = work / "id_ed25519"
    server.authorize(write_ed25519(key))
    with HubServer(hub) as hub_server:
        source = links(hub, hub_server, args.hosts, args.delay, args.mbit)
        endpoints = [f"http://127.0.0.1:{p.ports[0]}" for p in source]
        os.environ["HF_ENDPOINT"] = endpoints[0]  # the kernel lists there; host 0 downloads on its own link
        link = DelayProxy([(a, server.port) for a in server.addresses], args.ssh_delay).start()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                sl = manager.connect([f"127.0.0.1:{p}" for p in link.ports], key=str(key), python=server.python,
                                     name="fetch")
            ours = measure(lambda: print(sl.fetch("hf://org/big")), source, link)
            theirs = measure(lambda: sl.run(BASELINE.format(endpoints=endpoints), output=None).raise_for_status(),
                             source, link)
            same = sl.run(DIGESTS, output=None)
            digests = {tuple(v) for r in same.reprs.values() for v in eval(r)}  # noqa: S307 - our own cell's repr
            manager.down("fetch")
        finally:
            server.close()
    print(f"\n### {args.mb:g} MiB in {args.files} files to {args.hosts} hosts, each host on its own "
          f"{args.mbit:g} Mbit/s link to the Hub ({args.delay * 1000:g} ms each way), the kernel "
          f"{args.ssh_delay * 1000:g} ms from its hosts\n")
    print("| how | wall s | bytes from the Hub, by host's link | x model | bytes on the kernel's link | % of model |")
    print("|---|---|---|---|---|---|")
    for label, (seconds, served, carried) in (
            ("tpunb `%tpu_fetch` (host 0 downloads, relays; into the HF cache)", ours),
            ("`huggingface_hub.snapshot_download` on every host at once", theirs)):
        print(f"| {label} | {seconds:.1f} | {' / '.join(f'{b:,}' for b in served)} | {sum(served) / size:.2f} | "
              f"{carried:,} | {100 * carried / size:.1f} |")
    print(f"\nidentical files on every host, both ways: {len(digests) == 1}")


if __name__ == "__main__":
    main()
