"""The host side of %tpu_fetch (tpunb/host/download.py, fetch.py, receive.py) against the Hub
stand-in on 127.0.0.1: fresh downloads, resumes after a cut mid-file, a second fetch that moves
nothing, verification failures, a full disk (a real 1 MB tmpfs), the stream a relay forwards
(chunks handed on as they land, and a receiver writing them at offsets), a large file as pieces
in flight at once and resumed from the spans it kept, a source that ignores Range, a busy source's
Retry-After as an HTTP date, and the kernel's stream that writes nothing."""
from __future__ import annotations

import email.utils
import hashlib
import http.server
import json
import os
import threading
import time
from pathlib import Path

import pytest

from tpunb.sandbox.hub.hub_server import Hub, HubServer, git_blob_sha1
from tpunb.host import download as downloading
from tpunb.host.download import BUSY_TRIES, download, fetch_all, retry_after, stream
from tpunb.host.fetch import CHUNK, Entry, FetchError
from tpunb.host.receive import Receiver
from tests.test_snapshot import small_disk  # a real 1 MB tmpfs (tests run as root)

TOKEN = "hf_download_token_0123456789"
BIG = os.urandom(3 * CHUNK + 12345)
SMALL = b'{"vocab_size": 32}'


@pytest.fixture(scope="module")
def hub():
    state = Hub(tokens=(TOKEN,))
    with HubServer(state) as server:
        server.commit = state.add_repo("org/model", {"model.safetensors": BIG, "config.json": SMALL}, gated=True)
        yield server


def entry(hub, path: str, **change) -> Entry:
    data = {"model.safetensors": BIG, "config.json": SMALL}[path]
    check, digest = ("sha256", hashlib.sha256(data).hexdigest()) if path.endswith("safetensors") else \
        ("git-sha1", git_blob_sha1(data))
    fields = {"path": path, "size": len(data), "url": f"{hub.url}/org/model/resolve/{hub.commit}/{path}",
              "check": check, "digest": digest, "headers": {"Authorization": f"Bearer {TOKEN}"}}
    return Entry(**{**fields, **change})


def gets(hub, path: str) -> int:
    return hub.hub.gets[("org/model", path)]


def test_a_fresh_download_then_a_second_fetch_that_moves_nothing(hub, tmp_path):
    before = gets(hub, "model.safetensors"), gets(hub, "config.json")
    seen = []
    first = download(entry(hub, "model.safetensors"), str(tmp_path), progress=seen.append)
    small = download(entry(hub, "config.json"), str(tmp_path))
    assert (tmp_path / "model.safetensors").read_bytes() == BIG and (tmp_path / "config.json").read_bytes() == SMALL
    assert (first.moved, first.already, sum(seen), small.moved) == (len(BIG), False, len(BIG), len(SMALL))
    assert first.rate > 0 and not (tmp_path / "model.safetensors.partial").exists()
    again = [download(entry(hub, p), str(tmp_path)) for p in ("model.safetensors", "config.json")]
    assert [(o.moved, o.already) for o in again] == [(0, True), (0, True)]
    assert (gets(hub, "model.safetensors"), gets(hub, "config.json")) == (before[0] + 1, before[1] + 1)


def test_a_file_already_in_place_without_a_record_is_verified_not_fetched(hub, tmp_path):
    (tmp_path / "config.json").write_bytes(SMALL)
    before = gets(hub, "config.json")
    assert download(entry(hub, "config.json"), str(tmp_path)).already
    (tmp_path / "config.json").write_bytes(SMALL.upper())  # same size, other bytes: fetched again
    assert download(entry(hub, "config.json"), str(tmp_path)).moved == len(SMALL)
    assert (tmp_path / "config.json").read_bytes() == SMALL and gets(hub, "config.json") == before + 1


def test_a_cut_mid_file_resumes_with_a_range_and_the_same_bytes(hub, tmp_path):
    hub.hub.cut("model.safetensors", CHUNK + 100)
    mark = len(hub.hub.log)
    outcome = download(entry(hub, "model.safetensors"), str(tmp_path))
    assert (tmp_path / "model.safetensors").read_bytes() == BIG
    ranges = [span for method, path, span in hub.hub.log[mark:] if path.startswith("/_lfs/")]
    assert ranges == [None, f"bytes={CHUNK + 100}-"], ranges
    assert outcome.moved == len(BIG)


def test_a_stopped_download_resumes_from_its_partial_in_a_later_fetch(hub, tmp_path):
    got = []
    with pytest.raises(FetchError) as stopped:
        download(entry(hub, "model.safetensors"), str(tmp_path), progress=got.append, stop=lambda: len(got) >= 2)
    assert stopped.value.kind == "cancelled" and not (tmp_path / "model.safetensors").exists()
    assert (tmp_path / "model.safetensors.partial").stat().st_size == 2 * CHUNK
    mark = len(hub.hub.log)
    streamed = {}
    outcome = download(entry(hub, "model.safetensors"), str(tmp_path), on_chunk=streamed.__setitem__)
    assert outcome.resumed_from == 2 * CHUNK and outcome.moved == len(BIG) - 2 * CHUNK
    assert [s for _, p, s in hub.hub.log[mark:] if p.startswith("/_lfs/")] == [f"bytes={2 * CHUNK}-"]
    assert b"".join(streamed[k] for k in sorted(streamed)) == BIG, "the stream holds the partial's bytes too"
    assert (tmp_path / "model.safetensors").read_bytes() == BIG


def test_a_verification_failure_leaves_nothing_that_looks_complete(hub, tmp_path):
    for wrong in (entry(hub, "model.safetensors", digest="0" * 64), entry(hub, "config.json", digest="1" * 40)):
        with pytest.raises(FetchError) as failed:
            download(wrong, str(tmp_path))
        assert failed.value.kind == "verify" and "\n" not in str(failed.value)
        assert f"verification failed, its {wrong.check} is " in str(failed.value)
        assert f"removed {tmp_path / wrong.path}.partial" in str(failed.value)
        assert not (tmp_path / wrong.path).exists() and not Path(f"{tmp_path / wrong.path}.partial").exists()


def test_a_full_disk_keeps_only_the_partial_and_says_so(hub, tmp_path):
    with small_disk(tmp_path / "full") as full:
        with pytest.raises(FetchError) as failed:
            download(entry(hub, "model.safetensors"), str(full / "models"))
        message = str(failed.value)
        assert failed.value.kind == "disk" and "\n" not in message
        assert message.startswith("model.safetensors: no space left on the device writing "), message
        assert "kept there): free space and fetch again, it resumes" in message
        assert sorted(os.listdir(full / "models")) == ["model.safetensors.partial"]
        os.unlink(full / "models" / "model.safetensors.partial")
        receiver = Receiver(entry(hub, "model.safetensors"), str(full / "relayed"))
        with pytest.raises(FetchError) as relayed:
            for at in range(0, len(BIG), CHUNK):
                receiver.put(at, BIG[at:at + CHUNK])
            receiver.finish(timeout=60)
        assert relayed.value.kind == "disk" and "no space left on the device" in str(relayed.value)
        assert sorted(os.listdir(full / "relayed")) == ["model.safetensors.partial"]


def test_the_token_never_shows_in_reprs_or_errors(hub, tmp_path):
    secret = entry(hub, "config.json", url=f"{hub.url}/org/model/resolve/nope/config.json")
    assert TOKEN not in repr(secret) and TOKEN in str(secret.to_wire())
    with pytest.raises(FetchError) as failed:
        download(secret, str(tmp_path))
    assert failed.value.kind == "source" and "RevisionNotFound" in str(failed.value)
    anonymous = entry(hub, "config.json", headers={})
    with pytest.raises(FetchError) as gated:
        download(anonymous, str(tmp_path))
    assert "HTTP 401 (GatedRepo)" in str(gated.value)
    for text in (str(failed.value), repr(failed.value), str(gated.value)):
        assert TOKEN not in text


def test_a_stream_forwarded_as_it_downloads_lands_whole_through_a_receiver(hub, tmp_path):
    wanted = entry(hub, "model.safetensors")
    receiver = Receiver(wanted, str(tmp_path / "peer"))
    download(wanted, str(tmp_path / "root"), on_chunk=receiver.put)
    outcome = receiver.finish(timeout=60)
    assert (tmp_path / "peer" / "model.safetensors").read_bytes() == BIG == (tmp_path / "root" / "model.safetensors").read_bytes()
    assert outcome.moved == len(BIG) and not (tmp_path / "peer" / "model.safetensors.partial").exists()


def test_a_receiver_takes_chunks_in_any_order_and_refuses_a_damaged_or_short_file(hub, tmp_path):
    wanted = entry(hub, "model.safetensors")
    pieces = [(at, BIG[at:at + 70_000]) for at in range(0, len(BIG), 70_000)]
    receiver = Receiver(wanted, str(tmp_path / "shuffled"))
    for at, data in reversed(pieces):
        receiver.put(at, data)
    receiver.finish(timeout=60)
    assert (tmp_path / "shuffled" / "model.safetensors").read_bytes() == BIG
    short = Receiver(wanted, str(tmp_path / "short"))
    for at, data in pieces[:-1]:
        short.put(at, data)
    with pytest.raises(FetchError) as missing:
        short.finish(timeout=60)
    assert missing.value.kind == "network" and not (tmp_path / "short" / "model.safetensors").exists()
    damaged = Receiver(wanted, str(tmp_path / "damaged"))
    for at, data in pieces:
        damaged.put(at, data if at else b"\0" + data[1:])
    with pytest.raises(FetchError) as wrong:
        damaged.finish(timeout=60)
    assert wrong.value.kind == "verify" and os.listdir(tmp_path / "damaged") == []


def test_fetch_all_says_what_it_moved_and_what_was_already_there(hub, tmp_path):
    wires = [entry(hub, path).to_wire() for path in ("config.json", "model.safetensors")]
    first = fetch_all(wires, str(tmp_path))
    assert (first["files"], first["moved"], first["already"]) == (2, len(SMALL) + len(BIG), 0)
    second = fetch_all(wires, str(tmp_path))
    assert (second["moved"], second["already"]) == (0, 2)


def test_a_throttled_source_is_asked_again_after_its_retry_after(hub, tmp_path):
    hub.hub.busy("config.json", times=2)
    mark = len(hub.hub.log)
    assert download(entry(hub, "config.json"), str(tmp_path)).moved == len(SMALL)
    assert [m for m, p, _ in hub.hub.log[mark:] if p.endswith("/config.json")] == ["GET"] * 3
    hub.hub.busy("config.json", times=BUSY_TRIES + 1)
    with pytest.raises(FetchError) as throttled:
        download(entry(hub, "config.json"), str(tmp_path / "again"))
    assert f"answered HTTP 429 {BUSY_TRIES + 1} times (throttled or down): fetch again later" in str(throttled.value)
    hub.hub.busy("config.json", times=0)


def test_retry_after_is_read_as_seconds_an_http_date_or_an_exhausted_rate_limit():
    now = 1_700_000_000.0
    assert retry_after({"Retry-After": "120"}, now) == 120.0
    assert retry_after({"Retry-After": email.utils.formatdate(now + 42, usegmt=True)}, now) == 42.0
    assert retry_after({"Retry-After": email.utils.formatdate(now - 5, usegmt=True)}, now) == 0.0
    assert retry_after({"RateLimit": '"resolvers";r=0;t=55'}, now) == 55.0  # the Hub's header, window spent
    assert retry_after({"RateLimit": '"resolvers";r=3;t=55'}, now) is None
    assert retry_after({"Retry-After": "soon"}, now) is None and retry_after({}, now) is None


def test_a_busy_source_is_waited_for_until_the_date_its_retry_after_names(hub, tmp_path):
    hub.hub.busy("config.json", times=1, retry_after=email.utils.formatdate(time.time() + 2, usegmt=True))
    started = time.monotonic()
    assert download(entry(hub, "config.json"), str(tmp_path)).moved == len(SMALL)
    assert time.monotonic() - started >= 1.0, "the date's second, not an immediate retry"  # whole seconds in a date


@pytest.fixture
def pieces(monkeypatch):
    """Large files as pieces of 256 KiB (the real threshold is 64 MiB)."""
    monkeypatch.setattr(downloading, "PIECE", 256 << 10)
    return 256 << 10


def lfs_gets(hub, mark: int) -> list:
    return [span for method, path, span in hub.hub.log[mark:] if method == "GET" and path.startswith("/_lfs/")]


def span(header: str) -> tuple[int, int]:
    """A Range header's first and last byte ("bytes=A-": to the end of BIG)."""
    lo, hi = header.removeprefix("bytes=").split("-")
    return int(lo), int(hi) if hi else len(BIG) - 1


def test_a_large_file_comes_as_pieces_at_once_hashed_in_order_as_they_land(hub, tmp_path, pieces):
    mark, hub.hub.peak = len(hub.hub.log), 0
    hub.hub.rate = 4 << 20  # each transfer held to 4 MiB/s: the pieces overlap
    try:
        outcome = download(entry(hub, "model.safetensors"), str(tmp_path))
    finally:
        hub.hub.rate = None
    assert (tmp_path / "model.safetensors").read_bytes() == BIG and outcome.moved == len(BIG)
    spans = lfs_gets(hub, mark)
    assert spans[0] == f"bytes=0-{pieces - 1}", "the first piece alone, until the source shows it takes ranges"
    cuts = sorted(span(s) for s in spans)
    assert cuts == [(lo, min(lo + pieces, len(BIG)) - 1) for lo in range(0, len(BIG), pieces)]
    assert hub.hub.peak > 1, "pieces in flight at once"
    assert not list(tmp_path.glob("*.partial*"))


def test_pieces_stopped_midway_resume_from_the_spans_kept_beside_the_partial(hub, tmp_path, pieces):
    got = []
    with pytest.raises(FetchError) as stopped:
        download(entry(hub, "model.safetensors"), str(tmp_path), progress=got.append, streams=2,
                 stop=lambda: sum(got) >= len(BIG) // 2)
    assert stopped.value.kind == "cancelled"
    kept = json.loads((tmp_path / "model.safetensors.partial.spans").read_text())
    have = sum(hi - lo for lo, hi in kept)
    assert 0 < have < len(BIG), kept
    mark = len(hub.hub.log)
    streamed = {}
    outcome = download(entry(hub, "model.safetensors"), str(tmp_path), on_chunk=streamed.__setitem__)
    assert outcome.resumed_from == have and outcome.moved == len(BIG) - have
    asked = [span(s) for s in lfs_gets(hub, mark)]
    assert sum(hi + 1 - lo for lo, hi in asked) == len(BIG) - have
    assert not any(lo < k_hi and k_lo <= hi for lo, hi in asked for k_lo, k_hi in kept), "nothing held asked again"
    assert b"".join(streamed[k] for k in sorted(streamed)) == BIG, "the stream holds the kept spans too"
    assert (tmp_path / "model.safetensors").read_bytes() == BIG
    assert not (tmp_path / "model.safetensors.partial.spans").exists()


def test_a_source_that_ignores_range_is_read_in_one_stream(tmp_path, pieces):
    served = tmp_path / "served"
    served.mkdir()
    (served / "weights.bin").write_bytes(BIG)

    class Plain(http.server.SimpleHTTPRequestHandler):  # the standard library's: no Range support
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d/weights.bin" % server.server_address[1]
        wanted = Entry("weights.bin", len(BIG), url, "sha256", hashlib.sha256(BIG).hexdigest())
        assert download(wanted, str(tmp_path / "out")).moved == len(BIG)
        assert (tmp_path / "out" / "weights.bin").read_bytes() == BIG
        assert not list((tmp_path / "out").glob("*.partial*"))
    finally:
        server.shutdown()
        server.server_close()


def test_the_kernels_stream_hands_every_byte_on_verified_and_writes_nothing(hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = {}
    hub.hub.cut("model.safetensors", CHUNK + 100)
    mark = len(hub.hub.log)
    assert stream(entry(hub, "model.safetensors"), got.__setitem__) == len(BIG)
    assert b"".join(got[k] for k in sorted(got)) == BIG
    assert lfs_gets(hub, mark) == [None, f"bytes={CHUNK + 100}-"], "resumed after the last byte handed on"
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FetchError) as wrong:
        stream(entry(hub, "model.safetensors", digest="0" * 64), lambda at, data: None)
    assert wrong.value.kind == "verify"
