"""Which TPU worker this VM is, from its metadata server: run by the kernel over SSH before a
Compute Engine slice's agents start, so hosts are numbered by the worker id each VM was given,
never by the order a MIG lists its instances in. ``worker-id``, else ``TPU_WORKER_ID`` in
``tpu-env`` (docs/cloud-facts.md, Compute Engine). A request arrives length-prefixed on stdin
(ignored), the reply goes back the same way: ``{"worker": "3"}`` (None when neither is there).

Standalone: the standard library only, no relative import (it runs as ``python3 -c``)."""
from __future__ import annotations

import json
import os
import re
import sys
import urllib.request


def attribute(key: str) -> str | None:
    host = os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP") or "metadata.google.internal"
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/attributes/{key}",
                                     headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.read().decode()
    except (OSError, ValueError):
        return None


def worker() -> str | None:
    found = attribute("worker-id")
    if found is not None and found.strip().isdigit():
        return found.strip()
    match = re.search(r"^TPU_WORKER_ID:\s*'?(\d+)", attribute("tpu-env") or "", re.M)
    return match.group(1) if match else None


if __name__ == "__main__":
    size = sys.stdin.buffer.read(12)
    sys.stdin.buffer.read(int(size) if size.strip().isdigit() else 0)
    reply = json.dumps({"worker": worker()}).encode()
    sys.stdout.buffer.write(b"%012d" % len(reply) + reply)
    sys.stdout.flush()
