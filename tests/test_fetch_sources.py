"""%tpu_fetch of ``gs://`` and ``https://`` sources through a real IPython shell, onto two real sshd
hosts on loopback addresses, each with a home of its own: gcp-storage-emulator serves the bucket
(objects checked by md5), the Hub stand-in's resolve URLs serve a plain HTTP file (checked by size
and ETag; "http://" here: the same code path as https, no certificate on 127.0.0.1). Each lands
identical on both hosts from one GET, a second fetch moves nothing and says so, a missing object
or a 404 is one line, and a source that drops the connection at the same byte every time is a
one-line failure that resumes (not a switch to the kernel's own download, which is only for hosts
that reach no byte of the source)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tpunb import manager
from tpunb.sandbox.hub.hub_server import Hub, HubServer
from tpunb.sandbox.storage.cloud_storage import StorageEmulator
from tpunb.engine import connection
from tpunb.host import gcs
from tpunb.host.download import RETRIES
from tpunb.host.fetch import CHUNK
from tests.conftest import CPU_AS_TPU_HOST

BUCKET = "fetch-magic"
WEIGHTS = os.urandom(2 * CHUNK + 777)
FILES = {"config.json": b'{"layers": 2}', "model.safetensors": WEIGHTS, "tokenizer/vocab.json": b'{"a": 0}'}


@pytest.fixture(scope="module")
def hub():
    with HubServer(Hub()) as server:
        server.hub.add_repo("org/web", {"big.bin": WEIGHTS, "mid.bin": WEIGHTS[::-1]})
        yield server


@pytest.fixture(scope="module")
def storage():
    with StorageEmulator((BUCKET,)) as server:
        yield server


def connect(sshd, ssh_key, monkeypatch, name: str, count: int = 2):
    """A slice of ``count`` sshd hosts (JSON frames, as hosts on another Python speak)."""
    monkeypatch.setattr(connection, "MARSHAL_FRAMES", False)
    addresses = [f"{a}:{sshd.port}" for a in sshd.addresses[:count]]
    return manager.connect(addresses, key=str(ssh_key), python=sshd.python, name=name, accelerator="v4-16",
                           env=CPU_AS_TPU_HOST)


def homes(sshd, count: int = 2) -> list[Path]:
    return [sshd.home(a) for a in sshd.addresses[:count]]


def tree(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (records under .cache aside) by its sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file() and ".cache" not in p.relative_to(folder).parts}


def one_line(run) -> str:
    assert run.error is not None, run.shown
    text = str(run.error)
    assert "\n" not in text and "Traceback" not in run.shown, run.shown
    return text


@pytest.mark.fresh_slice
def test_a_bucket_prefix_lands_identical_on_two_hosts_checked_by_md5(cell, sshd, ssh_key, monkeypatch, storage):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage.url)
    bucket = gcs.Bucket(BUCKET)
    for path, data in FILES.items():
        bucket.write(f"models/tiny/{path}", data)
    connect(sshd, ssh_key, monkeypatch, "buckets")
    run = cell(f"%tpu_fetch gs://{BUCKET}/models/tiny --to ~/gs")
    assert run.error is None, run.shown
    assert "host 0 took 2.0 MiB from the source once; relayed to host 1 over the slice's network" in run.stdout, run.stdout
    expected = {p: hashlib.sha256(d).hexdigest() for p, d in FILES.items()}
    first, second = (home / "gs" for home in homes(sshd))
    assert tree(first) == tree(second) == expected
    # each host recorded the file as verified by the object's md5, as the bucket lists it
    [listed] = bucket.items("models/tiny/model.safetensors")
    for folder in (first, second):
        record = json.loads((folder / ".cache/tpunb/model.safetensors.json").read_text())
        assert (record["check"], record["digest"], record["size"]) == ("md5", listed["md5Hash"], len(WEIGHTS))
    again = cell(f"%tpu_fetch gs://{BUCKET}/models/tiny --to ~/gs")
    assert again.error is None and "already there: no bytes moved" in again.stdout, again.shown
    # a file of the right size with other bytes on host 1 fails its md5: that host alone gets it again
    (second / "model.safetensors").write_bytes(os.urandom(len(WEIGHTS)))
    (second / ".cache/tpunb/model.safetensors.json").unlink()
    fixed = cell(f"%tpu_fetch gs://{BUCKET}/models/tiny --to ~/gs")
    assert fixed.error is None and "host 1 took 2.0 MiB from the source once" in fixed.stdout, fixed.shown
    assert tree(second) == expected
    missing = one_line(cell(f"%tpu_fetch gs://{BUCKET}/models/absent --to ~/gs2"))
    assert missing.startswith(f"nothing is under gs://{BUCKET}/models/absent: check the bucket and prefix"), missing
    assert not any((home / "gs2").exists() and tree(home / "gs2") for home in homes(sshd))


@pytest.mark.fresh_slice
def test_an_https_file_lands_identical_checked_by_size_and_etag_and_a_404_is_one_line(cell, sshd, ssh_key,
                                                                                       monkeypatch, hub):
    connect(sshd, ssh_key, monkeypatch, "webby")
    url = f"{hub.url}/org/web/resolve/main/big.bin"
    before, mark = hub.hub.gets[("org/web", "big.bin")], len(hub.hub.log)
    run = cell(f"%tpu_fetch {url} --to ~/web")
    assert run.error is None, run.shown
    assert "host 0 took 2.0 MiB from the source once; relayed to host 1" in run.stdout, run.stdout
    # listed by a GET of its first byte (the CDN's signed URL refuses a HEAD), then downloaded once
    assert [(m, r) for m, p, r in hub.hub.log[mark:] if p.startswith("/_lfs/")] == [("GET", "bytes=0-0"), ("GET", None)]
    assert hub.hub.gets[("org/web", "big.bin")] == before + 2
    for home in homes(sshd):
        assert (home / "web/big.bin").read_bytes() == WEIGHTS
        record = json.loads((home / "web/.cache/tpunb/big.bin.json").read_text())
        assert (record["check"], record["size"]) == ("etag", len(WEIGHTS)) and record["digest"].strip('"'), record
    again = cell(f"%tpu_fetch {url} --to ~/web")
    assert again.error is None and "already there: no bytes moved" in again.stdout, again.shown
    assert hub.hub.gets[("org/web", "big.bin")] == before + 3, "the listing's byte only"
    absent = one_line(cell(f"%tpu_fetch {hub.url}/org/web/resolve/main/absent.bin --to ~/web"))
    assert absent.startswith(f"{hub.url}/org/web/resolve/main/absent.bin answered HTTP 404"), absent


@pytest.mark.fresh_slice
def test_a_source_that_drops_mid_file_is_a_resumable_failure_not_a_switch_to_the_kernel(cell, sshd, ssh_key,
                                                                                        monkeypatch, hub):
    connect(sshd, ssh_key, monkeypatch, "dropped")
    url = f"{hub.url}/org/web/resolve/main/mid.bin"
    cut = CHUNK + 100
    hub.hub.cut("mid.bin", cut, times=50)  # every GET ends at that byte: each resume gets none
    mark = len(hub.hub.log)
    try:
        failed = one_line(cell(f"%tpu_fetch {url} --to ~/mid"))
        gets = [span for method, path, span in hub.hub.log[mark:] if method == "GET" and path.startswith("/_lfs/")]
    finally:
        hub.hub.cut("mid.bin", 0, times=0)
    assert failed.startswith("host 0: mid.bin: the connection to "), failed
    assert f"kept breaking (IncompleteRead) with {cut:,} of {len(WEIGHTS):,} bytes" in failed and \
        failed.endswith("fetch again, it resumes"), failed
    # the listing's first byte, the host's own tries (the first, then a resume per retry), and no download by
    # the kernel after them
    assert gets == ["bytes=0-0", None] + [f"bytes={cut}-"] * (RETRIES + 1), gets
    first, second = (home / "mid" for home in homes(sshd))
    assert (first / "mid.bin.partial").stat().st_size == cut
    assert not (first / "mid.bin").exists() and not (second / "mid.bin").exists()
    mark = len(hub.hub.log)
    resumed = cell(f"%tpu_fetch {url} --to ~/mid")
    assert resumed.error is None and "host 0 took" in resumed.stdout, resumed.shown
    assert [span for method, path, span in hub.hub.log[mark:] if method == "GET" and path.startswith("/_lfs/")] == \
        ["bytes=0-0", f"bytes={cut}-"]
    assert (first / "mid.bin").read_bytes() == (second / "mid.bin").read_bytes() == WEIGHTS[::-1]
