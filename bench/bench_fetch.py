"""%tpu_fetch against every host downloading at once (issue 37): a model from the Hub to a slice.

    python bench/bench_fetch.py [--mb 1024] [--hosts 4] [--mbit 800] [--delay 0.02] [--ssh-delay 0.02]

The source is the Hub stand-in (tpunb/emulator/hub.py, the real huggingface_hub client reads it)
behind bench/delay_proxy.py: ``--delay`` s each way and one shared link of ``--mbit`` Mbit/s, as
a slice's link to the Hub is; the proxy counts the bytes the source served. The hosts are real
OpenSSH sshd hosts on loopback addresses, each with a home of its own, reached by the kernel
(this process) through a second proxy (``--ssh-delay`` s each way, no rate limit) that counts
the bytes on the kernel's link; the hosts reach each other directly, as a slice's hosts do.
The model is one ``--mb`` MB safetensors file of random bytes and a config.json.

1. tpunb: ``Slice.fetch("hf://org/big", "~/models/tpunb")``: one host downloads and relays.
2. huggingface_hub: every host runs ``snapshot_download(..., local_dir="~/models/hf")`` at once.
For each: wall seconds, bytes the source served, bytes on the kernel's link.
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
from tpunb.emulator.hub import Hub, HubServer  # noqa: E402
from tpunb.emulator.sshd import Sshd, write_ed25519  # noqa: E402

#: what every host runs for the baseline (the Hub's address in HF_ENDPOINT, set before the import). The
#: proxy's link is first come, first served (not TCP's fair share): a connection may wait for others'
#: bytes longer than huggingface_hub's 10 s read timeout, which is raised here so the total is measured
BASELINE = ("import os, time\nos.environ['HF_ENDPOINT'] = {endpoint!r}\nos.environ['HF_HUB_DISABLE_PROGRESS_BARS'] = '1'\n"
            "os.environ['HF_HUB_DOWNLOAD_TIMEOUT'] = '600'\n"
            "from huggingface_hub import snapshot_download\n"
            "snapshot_download('org/big', local_dir=os.path.expanduser('~/models/hf'), token=False)\n'ok'")


def measure(what, source: DelayProxy, link: DelayProxy) -> tuple[float, int, int]:
    """(wall seconds, bytes the source served, bytes on the kernel's link) of ``what()``."""
    served, carried = source.down, link.up + link.down
    started = time.perf_counter()
    what()
    return time.perf_counter() - started, source.down - served, link.up + link.down - carried


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=1024, help="the model's size in MiB")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--mbit", type=float, default=800.0, help="the source's shared link, Mbit/s (0: none)")
    parser.add_argument("--delay", type=float, default=0.02, help="the source link's one-way delay, s")
    parser.add_argument("--ssh-delay", type=float, default=0.02, help="the kernel's link's one-way delay, s")
    args = parser.parse_args()
    os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-bench-fetch-home-"))
    work = Path(tempfile.mkdtemp(prefix="tpunb-bench-fetch-"))
    size = int(args.mb * (1 << 20))
    hub = Hub()
    hub.add_repo("org/big", {"config.json": b'{"hidden_size": 4096}', "model.safetensors": os.urandom(size)})
    server = Sshd(hosts=args.hosts, directory=work / "sshd")
    key = work / "id_ed25519"
    server.authorize(write_ed25519(key))
    with HubServer(hub) as hub_server:
        origins = [tuple(u.removeprefix("http://").rsplit(":", 1)) for u in (hub_server.url, hub.cdn_url)]
        source = DelayProxy([(h, int(p)) for h, p in origins], args.delay, args.mbit).start()
        endpoint, hub.cdn_url = (f"http://127.0.0.1:{p}" for p in source.ports)
        os.environ["HF_ENDPOINT"] = endpoint
        link = DelayProxy([(a, server.port) for a in server.addresses], args.ssh_delay).start()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                sl = manager.connect([f"127.0.0.1:{p}" for p in link.ports], key=str(key), python=server.python,
                                     name="fetch")
            ours = measure(lambda: print(sl.fetch("hf://org/big", "~/models/tpunb")), source, link)
            theirs = measure(lambda: sl.run(BASELINE.format(endpoint=endpoint), output=None).raise_for_status(),
                             source, link)
            same = sl.run("import hashlib, os\n[hashlib.sha256(open(os.path.expanduser(f'~/models/{d}/model.safetensors'), "
                          "'rb').read()).hexdigest() for d in ('tpunb', 'hf')]", output=None)
            digests = {v for r in same.reprs.values() for v in eval(r)}  # noqa: S307 - our own cell's repr
            manager.down("fetch")
        finally:
            server.close()
    print(f"\n### {args.mb:g} MiB to {args.hosts} hosts, the source behind a shared {args.mbit:g} Mbit/s link "
          f"({args.delay * 1000:g} ms each way), the kernel {args.ssh_delay * 1000:g} ms from its hosts\n")
    print("| how | wall s | bytes the source served | x model | bytes on the kernel's link | % of model |")
    print("|---|---|---|---|---|---|")
    for label, (seconds, served, carried) in (("tpunb %tpu_fetch (one host downloads, relays)", ours),
                                              ("huggingface_hub snapshot_download on every host", theirs)):
        print(f"| {label} | {seconds:.1f} | {served:,} | {served / size:.2f} | {carried:,} | {100 * carried / size:.1f} |")
    print(f"\nidentical files on every host, both ways: {len(digests) == 1}")


if __name__ == "__main__":
    main()
