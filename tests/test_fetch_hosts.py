"""%tpu_fetch across real sshd hosts on loopback addresses, each with a home of its own, in the
ways hosts differ: two hosts whose folder is one shared folder (a network folder, reached through
a different path on each) write it once, found by the markers each leaves; a receiver whose disk
fills mid-transfer, after the free-space check passed (a real tmpfs filled by another writer), is
one line naming the cause and the host, with no file in place and its partial kept; and a fetch
through the kernel holds at most its window of chunks while the receiver cannot take them
(measured as the chunk bytes waiting in the kernel's request inbox, not its RSS)."""
from __future__ import annotations

import errno
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tpunb import manager
from tpunb.sandbox.hub.hub_server import Hub, HubServer
from tpunb.engine.ctrl_c import Inbox
from tpunb.fetch import spread
from tpunb.host.fetch import CHUNK
from tests.conftest import wait_for
from tests.test_fetch_sources import connect, homes, one_line
from tests.test_snapshot import small_disk  # a real tmpfs (tests run as root)

WEIGHTS = os.urandom(2 * CHUNK + 777)
#: larger than the window many times over, and than what the SSH links buffer
HUGE = os.urandom(32 * CHUNK + 5)
WINDOW = 4 * CHUNK


@pytest.fixture(scope="module")
def hub():
    with HubServer(Hub()) as server:
        server.hub.add_repo("org/files", {"big.bin": WEIGHTS, "huge.bin": HUGE})
        yield server


def url(hub, name: str) -> str:
    return f"{hub.url}/org/files/resolve/main/{name}"


@pytest.mark.fresh_slice
def test_hosts_whose_folder_is_one_shared_folder_write_it_once(cell, sshd, ssh_key, monkeypatch, hub, tmp_path):
    shared = tmp_path / "network-share"
    shared.mkdir()
    links = [home / f"net-{tmp_path.name}" for home in homes(sshd)]
    for link in links:  # each host reaches the share by a path of its own, as a mount point would be
        link.symlink_to(shared)
    try:
        connect(sshd, ssh_key, monkeypatch, "sharing")
        before = hub.hub.gets[("org/files", "big.bin")]
        run = cell(f"%tpu_fetch {url(hub, 'big.bin')} --to ~/{links[0].name}/m")
        assert run.error is None, run.shown
        assert "host 0 took 2.0 MiB from the source once; written once: host 1 shares the file system of host 0" \
            in run.stdout, run.stdout
        assert "host 0: 100%" in run.stderr and "host 1:" not in run.stderr, run.stderr  # one writer, one bar
        assert hub.hub.gets[("org/files", "big.bin")] == before + 2  # the listing's first byte, then the file once
        assert (shared / "m/big.bin").read_bytes() == WEIGHTS and not list(shared.rglob("*.partial"))
        assert not (shared / "m/.cache/tpunb/hosts").exists(), "the hosts' markers were left behind"
        # folders that are not shared are each written (their markers seen by their own host only)
        own = cell(f"%tpu_fetch {url(hub, 'big.bin')} --to ~/own-{tmp_path.name}")
        assert own.error is None and "relayed to host 1" in own.stdout and "written once" not in own.stdout, own.shown
    finally:
        for link in links:
            link.unlink()


def fill(folder: Path) -> Path:
    """Another writer takes every free byte of ``folder``'s disk."""
    filler = folder / "filler"
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


@pytest.mark.fresh_slice
def test_a_receivers_disk_filling_mid_transfer_is_one_line_naming_the_host(cell, sshd, ssh_key, monkeypatch, hub):
    home0, home1 = homes(sshd)
    connect(sshd, ssh_key, monkeypatch, "filling")
    with small_disk(home1 / "small", "3m") as small:  # room for the file: the check passes
        partial = small / "m/big.bin.partial"
        filled: dict = {}

        def fill_once_bytes_land() -> None:
            wait_for(lambda: partial.exists() and partial.stat().st_size > 0, what="host 1's first bytes")
            filled["filler"] = fill(small)

        hub.hub.rate = 1 << 20  # 2 MiB at 1 MiB/s: the disk fills between two chunks
        try:
            filler = threading.Thread(target=fill_once_bytes_land, daemon=True)
            filler.start()
            text = one_line(cell(f"%tpu_fetch {url(hub, 'big.bin')} --to ~/small/m"))
            filler.join(60)
        finally:
            hub.hub.rate = None
        assert text.startswith(f"host 1: big.bin: no space left on the device writing {partial} ("), text
        assert text.endswith("bytes kept there): free space and fetch again, it resumes"), text
        assert not (small / "m/big.bin").exists() and partial.exists()  # nothing that looks complete
        landed = home0 / "small/m/big.bin"  # the downloader's copy: whole and verified, if it finished first
        assert not landed.exists() or landed.read_bytes() == WEIGHTS
        filled["filler"].unlink()
        again = cell(f"%tpu_fetch {url(hub, 'big.bin')} --to ~/small/m")
        assert again.error is None, again.shown
        assert (small / "m/big.bin").read_bytes() == (home0 / "small/m/big.bin").read_bytes() == WEIGHTS
        assert not partial.exists()


@pytest.fixture
def kernel_holds(monkeypatch):
    """The fetch_chunk bytes waiting in the kernel's request inboxes: now, and the peak."""
    held = {"now": 0, "peak": 0}
    lock = threading.Lock()
    put, get = Inbox.put, Inbox.get

    def counted_put(self, item) -> None:
        if item[1].get("op") == "fetch_chunk":
            with lock:
                held["now"] += len(item[2])
                held["peak"] = max(held["peak"], held["now"])
        put(self, item)

    def counted_get(self, timeout, ctrl_c=None):
        item = get(self, timeout, ctrl_c)
        if item[1].get("op") == "fetch_chunk":
            with lock:
                held["now"] -= len(item[2])
        return item

    monkeypatch.setattr(Inbox, "put", counted_put)
    monkeypatch.setattr(Inbox, "get", counted_get)
    return held


def hold(seconds: float, broken) -> None:
    """Keep still for ``seconds`` (a measurement interval), or until ``broken()``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not broken():
        threading.Event().wait(0.02)


@pytest.mark.fresh_slice
def test_a_fetch_through_the_kernel_holds_at_most_its_window(cell, sshd, ssh_key, monkeypatch, hub, kernel_holds):
    monkeypatch.setenv("TPUNB_RELAY", "never")  # the hosts' bytes go through the kernel
    monkeypatch.setattr(spread, "WINDOW", WINDOW)
    home0, home1 = homes(sshd)
    connect(sshd, ssh_key, monkeypatch, "windowed")
    assert cell("%%on_tpu --hosts 1\nimport os\nos.getpid()").error is None
    agent = int(manager.last_result().reprs[1])  # host 1's agent: a process on this machine
    partial = home1 / "k/huge.bin.partial"
    seen: dict = {}

    def freeze_receiver() -> None:
        wait_for(lambda: partial.exists(), what="host 1's partial")
        os.kill(agent, signal.SIGSTOP)  # host 1 takes no byte: the kernel's sends to it stall
        try:
            # the chunk it is sending stays unacknowledged beside those waiting: near a window waits
            wait_for(lambda: kernel_holds["now"] >= WINDOW - 2 * CHUNK, 30, "the kernel to hold chunks")
            seen["reached"] = kernel_holds["now"]
            # long enough for the source to send the rest of the file: without a bound it would pile up here
            hold(1.0, lambda: kernel_holds["peak"] > WINDOW)
        finally:
            os.kill(agent, signal.SIGCONT)

    freezer = threading.Thread(target=freeze_receiver, daemon=True)
    freezer.start()
    run = cell(f"%tpu_fetch {url(hub, 'huge.bin')} --to ~/k")
    freezer.join(60)
    assert run.error is None, run.shown
    assert "the hosts cannot reach each other, so host 1 got the bytes through the kernel" in run.stdout, run.stdout
    assert seen.get("reached", 0) >= WINDOW - 2 * CHUNK > 0, seen
    assert kernel_holds["peak"] <= WINDOW and 8 * WINDOW < len(HUGE), kernel_holds
    assert (home0 / "k/huge.bin").read_bytes() == (home1 / "k/huge.bin").read_bytes() == HUGE
