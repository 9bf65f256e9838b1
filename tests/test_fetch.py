"""%tpu_fetch on slices, from the Hub stand-in (tpunb/sandbox/hub/hub_server.py: the Hub's HTTP API as the
real huggingface_hub client reads it). On a 2-host cloud sandbox slice (real sshd hosts, each its
own home) a gated repository lands identical on both hosts with one GET per file, relayed host to
host while a cell holds the hosts' main threads (through the kernel when the relay is off or cannot
reach a host), the token in no output even when a host prints it, nor in any file; without --to
it lands in each host's Hugging Face cache, where huggingface_hub finds it offline, and the
kernel's HF_* settings stay out of every host's environment; a bucket is read with the VMs' own
service account, and one that refuses it with the kernel's token, one per file. On a local slice
the files are written once; hosts without a route to the source get it from the kernel; a fetch
cut short resumes; a second fetch moves nothing; every bad input is one line."""
from __future__ import annotations

import hashlib
import os
import signal
import threading
from pathlib import Path

import pytest

from tpunb import manager
from tpunb.sandbox.iam.accounts import default_service_account
from tpunb.sandbox.hub.hub_server import Hub, HubServer
from tpunb.sandbox.storage.cloud_storage import StorageEmulator, StorageGate
from tpunb.engine.masking import MASK
from tpunb.fetch import storage as listing
from tpunb.host import gcs
from tpunb.host.download import BUSY_TRIES
from tpunb.host.fetch import CHUNK
from tests.conftest import wait_for
from tests.emulator_fixture import FAST, configure
from tests.test_fetch_manifest import kernel_env  # noqa: F401 - the kernel's Hub settings, autouse
from tests.test_snapshot import small_disk  # a real 1 MB tmpfs (tests run as root)

TOKEN = "hf_fetch_magic_token_0123456789"
WEIGHTS = os.urandom(3 * CHUNK + 4321)
FILES = {"config.json": b'{"hidden_size": 8}', "model.safetensors": WEIGHTS, "tokenizer/vocab.json": b'{"a": 0}',
         "empty.txt": b""}
#: a bucket's objects (gcp-storage-emulator drops an empty upload)
OBJECTS = {path: data for path, data in FILES.items() if data}
#: an empty file needs no GET
ONE_GET_EACH = {path: int(bool(data)) for path, data in FILES.items()}


@pytest.fixture(scope="module")
def hub():
    state = Hub(tokens=(TOKEN,))
    with HubServer(state) as server:
        server.commits = {"gated": state.add_repo("org/gated", FILES, gated=True),
                          "open": state.add_repo("org/open", FILES),
                          "private": state.add_repo("org/private", FILES, private=True)}
        yield server


def gets(hub, repo: str) -> dict[str, int]:
    return {path: hub.hub.gets[(repo, path)] for path in FILES}


def same_files(folder: Path) -> None:
    for path, data in FILES.items():
        assert (folder / path).read_bytes() == data, path
    assert not list(folder.rglob("*.partial"))


def one_line(run) -> str:
    assert run.error is not None, run.shown
    text = str(run.error)
    assert "\n" not in text and TOKEN not in run.shown and "Traceback" not in run.shown, run.shown
    return text


@pytest.mark.fresh_slice
def test_a_local_slice_gets_the_files_written_once_and_a_second_fetch_moves_nothing(cell, hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert cell("%tpu_launch v4-16 --name fetchy").error is None
    before = gets(hub, "org/gated")
    target = tmp_path / "models" / "x"
    # a cell that runs on the hosts until the fetch put a file there: the fetch runs beside it
    waiting = cell(f"%%on_tpu --bg\nimport os, time\nwhile not os.path.exists({str(target / 'config.json')!r}):\n"
                   "    time.sleep(0.02)\n'saw it'")
    assert waiting.error is None, waiting.shown
    run = cell(f"%tpu_fetch hf://org/gated --to {target}")
    assert run.error is None, run.shown
    assert list(manager.last_run().result(timeout=60).reprs.values()) == ["'saw it'", "'saw it'"]
    same_files(target)
    assert {p: n - before[p] for p, n in gets(hub, "org/gated").items()} == ONE_GET_EACH
    assert "written once: host 1 shares the file system of host 0" in run.stdout, run.stdout
    assert "host 0: 100%" in run.stderr and "host 1:" not in run.stderr, run.stderr  # a bar for the one that wrote
    assert TOKEN not in run.shown
    again = cell(f"%tpu_fetch hf://org/gated --to {target}")
    assert again.error is None and "already there: no bytes moved" in again.stdout, again.shown
    assert gets(hub, "org/gated") == {p: n + ONE_GET_EACH[p] for p, n in before.items()}
    # one file only, by pattern, to another folder; the report says what moved
    only = manager.current().fetch("hf://org/open", str(tmp_path / "cfg"), include=["*.json"])
    assert (only.files, only.route) == (2, "source") and sorted(os.listdir(tmp_path / "cfg")) == [".cache", "config.json",
                                                                                                  "tokenizer"]


@pytest.mark.fresh_slice
def test_a_fetch_cut_short_resumes_from_its_partial(cell, hub, tmp_path):
    assert cell("%tpu_launch v4-8 --name resumer").error is None
    target = tmp_path / "resume"
    hub.hub.cut("model.safetensors", CHUNK + 100)
    hub.hub.busy("model.safetensors", times=BUSY_TRIES + 1, ranged=True)  # the resuming Range is refused too
    failed = cell(f"%tpu_fetch hf://org/open --to {target}")
    assert f"answered HTTP 429 {BUSY_TRIES + 1} times (throttled or down): fetch again later, it resumes" in \
        one_line(failed)
    assert not (target / "model.safetensors").exists()
    assert (target / "model.safetensors.partial").stat().st_size == CHUNK + 100
    hub.hub.busy("model.safetensors", times=0)
    resumes_from(cell, hub, target, CHUNK + 100)


def resumes_from(cell, hub, target, offset: int) -> None:
    """Fetch again: the files come out whole, the weights asked for only from ``offset`` on (a Range)."""
    mark = len(hub.hub.log)
    resumed = cell(f"%tpu_fetch hf://org/open --to {target}")
    assert resumed.error is None, resumed.shown
    same_files(target)
    assert [s for _, p, s in hub.hub.log[mark:] if p.startswith("/_lfs/")] == [f"bytes={offset}-"]


@pytest.mark.fresh_slice
def test_ctrl_c_stops_a_fetch_on_the_hosts_and_the_next_one_resumes(cell, hub, tmp_path):
    assert cell("%tpu_launch v4-8 --name pressed").error is None
    target = tmp_path / "pressed"
    partial = target / "model.safetensors.partial"

    def press() -> None:
        wait_for(lambda: partial.exists() and partial.stat().st_size > 0, what="the first bytes on the host")
        os.kill(os.getpid(), signal.SIGINT)

    hub.hub.rate = 1 << 20  # 3 MiB at 1 MiB/s: the press lands mid-file
    try:
        threading.Thread(target=press, daemon=True).start()
        stopped = cell(f"%tpu_fetch hf://org/open --to {target}")
    finally:
        hub.hub.rate = None
    assert one_line(stopped) == "the fetch was interrupted: fetch again, it resumes from what arrived"
    kept = partial.stat().st_size  # the host stopped (it answered within the grace): nothing writes it now
    assert 0 < kept < len(WEIGHTS) and not (target / "model.safetensors").exists()
    resumes_from(cell, hub, target, kept)


@pytest.mark.fresh_slice
def test_hosts_without_a_route_to_the_source_get_it_from_the_kernel_which_downloads_it_once(cell, hub, tmp_path):
    assert cell("%tpu_launch v4-8 --name walled --env http_proxy=http://127.0.0.1:9").error is None  # a dead proxy
    before = gets(hub, "org/open")
    run = cell(f"%tpu_fetch hf://org/open --to {tmp_path / 'walled'}")
    assert run.error is None, run.shown
    assert "the hosts cannot reach the source, so the kernel downloaded 3.0 MiB once; host 0 got the bytes through " \
           "the kernel" in run.stdout, run.stdout
    same_files(tmp_path / "walled")
    assert {p: n - before[p] for p, n in gets(hub, "org/open").items()} == ONE_GET_EACH


@pytest.mark.fresh_slice
def test_every_bad_input_is_one_line(cell, hub, tmp_path, monkeypatch):
    assert cell("%tpu_launch v4-8 --name bad").error is None
    usage = "Usage: %tpu_fetch [--to PATH] [--include GLOB [GLOB ...]]"
    assert one_line(cell("%tpu_fetch gs://bucket/m")).startswith("say where the files of gs://bucket/m go on the hosts: "
                                                                 "--to PATH (only hf:// repositories go to the Hugging "
                                                                 "Face cache by default)")
    bad = one_line(cell(f"%tpu_fetch ftp://x/y --to {tmp_path}"))
    assert bad.startswith("cannot fetch 'ftp://x/y': give hf://ORG/NAME, gs://BUCKET/PREFIX or https://...") and usage in bad
    assert "gated and the kernel has no Hugging Face token" in one_line(cell(f"%tpu_fetch hf://org/gated --to {tmp_path}/g"))
    assert "hf://org/private is not at" in one_line(cell(f"%tpu_fetch hf://org/private --to {tmp_path}/p"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert "has no revision 'nope'" in one_line(cell(f"%tpu_fetch hf://org/gated --revision nope --to {tmp_path}/r"))
    assert "--include *.bin matches none of the 4 files" in one_line(
        cell(f"%tpu_fetch hf://org/gated --include *.bin --to {tmp_path}/i"))
    with small_disk(tmp_path / "full") as full:
        text = one_line(cell(f"%tpu_fetch hf://org/gated --to {full}/m"))
        assert "no space left on the device" in text and "nothing was written" in text, text
        assert os.listdir(full / "m") == [], [str(p) for p in (full / "m").rglob("*")]
    assert not any(p.is_file() for p in tmp_path.rglob("*") if "full" not in p.parts), "a bad fetch wrote a file"


@pytest.fixture
def tpu_emulator_options(sshd):
    return {**FAST, **sshd.emulator_options()}  # each host a fresh VM image with a home of its own


#: run on each host: its folder, and the sha256 of every file under it
HASHES = ("%%on_tpu\nimport hashlib, os\nroot = os.path.expanduser('{to}')\n"
          "(os.path.realpath(root), sorted((os.path.relpath(os.path.join(d, f), root), "
          "hashlib.sha256(open(os.path.join(d, f), 'rb').read()).hexdigest()) for d, _, fs in os.walk(root) "
          "for f in fs if '.cache' not in d))")


def host_files(cell, to: str) -> list:
    run = cell(HASHES.format(to=to))
    assert run.error is None, run.shown
    result = manager.last_result()
    return [eval(result.reprs[i]) for i in sorted(result.reprs)]  # noqa: S307 - our own cell's repr


@pytest.mark.fresh_slice
def test_a_gated_repository_lands_identical_on_two_cloud_hosts_once_from_the_hub(tpu_emulator, cell, hub, monkeypatch,
                                                                                   isolated_home):
    configure(monkeypatch, "us-central2-b")
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # the kernel's: the launched slice gets it as a secret
    assert cell("%tpu_launch v4-16 --name hubby").error is None
    before = gets(hub, "org/gated")
    # a cell holds both hosts' main threads until the file is there: receivers write beside it
    waiting = cell("%%on_tpu --bg\nimport os, time\nwhile not os.path.exists(os.path.expanduser('~/models/x/config.json')):\n"
                   "    time.sleep(0.02)\n'saw it'")
    assert waiting.error is None, waiting.shown
    run = cell("%tpu_fetch hf://org/gated --to ~/models/x")
    assert run.error is None, run.shown
    assert list(manager.last_run().result(timeout=60).reprs.values()) == ["'saw it'", "'saw it'"]
    assert "host 0 took 3.0 MiB from the source once; relayed to host 1 over the slice's network as it downloaded " \
           "(0 bytes through the kernel)" in run.stdout, run.stdout
    assert {p: n - before[p] for p, n in gets(hub, "org/gated").items()} == ONE_GET_EACH
    expected = sorted((p, hashlib.sha256(d).hexdigest()) for p, d in FILES.items())
    (root0, files0), (root1, files1) = host_files(cell, "~/models/x")
    assert root0 != root1 and files0 == files1 == expected
    # the kernel's HF_ENDPOINT and HF_HUB_* did not stay in any host's environment
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "120")
    # without --to: each host's Hugging Face cache, where huggingface_hub finds it with the Hub out of reach
    cached = cell("%tpu_fetch hf://org/gated")
    assert cached.error is None and "at the Hugging Face cache (" in cached.stdout, cached.shown
    mark = dict(hub.hub.gets)
    offline = cell("%%on_tpu\nimport os, subprocess, sys\nprogram = ('import huggingface_hub; print(huggingface_hub."
                   "snapshot_download(\"org/gated\"))')\nfolder = subprocess.run([sys.executable, '-c', program], "
                   "env={**os.environ, 'HF_HUB_OFFLINE': '1'}, capture_output=True, text=True, check=True).stdout.strip()\n"
                   "(folder, sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs),"
                   " open(os.path.join(folder, 'model.safetensors'), 'rb').read() == open(os.path.expanduser("
                   "'~/models/x/model.safetensors'), 'rb').read(), sorted(k for k in os.environ if k.startswith('HF_') "
                   "and k != 'HF_TOKEN'))")
    assert offline.error is None, offline.shown
    for found in manager.last_result().reprs.values():
        folder, files, same, hf_env = eval(found)  # noqa: S307 - our own cell's repr
        assert folder.endswith(f"/.cache/huggingface/hub/models--org--gated/snapshots/{hub.commits['gated']}"), folder
        assert files == sorted(FILES) and same and hf_env == [], (files, hf_env)
    assert dict(hub.hub.gets) == mark, "nothing was downloaded again"
    printed = cell("%%on_tpu\nimport os\nprint('token:', os.environ['HF_TOKEN'])")
    assert printed.error is None and printed.stdout.count(f"token: {MASK}") >= 1 and TOKEN not in printed.shown
    # the relay off (as between hosts that cannot reach each other): through the kernel, and it says so
    monkeypatch.setenv("TPUNB_RELAY", "never")
    kernel = cell("%tpu_fetch hf://org/gated --to ~/models/y")
    assert "the hosts cannot reach each other, so host 1 got the bytes through the kernel" in kernel.stdout, kernel.shown
    assert [files for _, files in host_files(cell, "~/models/y")] == [expected, expected]
    # a relay that cannot reach its receiver (its listener's address is wrong): through the kernel instead
    monkeypatch.delenv("TPUNB_RELAY")
    session = manager.current().session
    session.relay.listen([0, 1])
    session.relay.listeners[1] = (session.relay.listeners[1][0], ["127.0.0.1", 9])
    walled = cell("%tpu_fetch hf://org/gated --to ~/models/z")
    assert "the hosts cannot reach each other, so host 1 got the bytes through the kernel" in walled.stdout, walled.shown
    assert [files for _, files in host_files(cell, "~/models/z")] == [expected, expected]
    again = cell("%tpu_fetch hf://org/gated --to ~/models/x")
    assert again.error is None and "already there: no bytes moved" in again.stdout, again.shown
    assert {p: n - before[p] for p, n in gets(hub, "org/gated").items()} == {p: 4 * n for p, n in ONE_GET_EACH.items()}
    scan = cell("%%on_tpu\nimport os\nhome = os.path.expanduser('~')\n"
                f"sum({TOKEN.encode()!r} in open(os.path.join(d, f), 'rb').read() for d, _, fs in os.walk(home) "
                "for f in fs if os.path.isfile(os.path.join(d, f)) and os.path.getsize(os.path.join(d, f)) < 8 << 20)")
    assert scan.error is None and "Out[0-1]: 0" in scan.shown, scan.shown  # no file on a host holds the token
    for shown in (run.shown, kernel.shown, walled.shown, again.shown):
        assert TOKEN not in shown
    kept = [p for p in isolated_home.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]
    assert not kept, f"the token is in {kept}"  # the registry, the hosts' logs kept here
    buckets_read_with_the_vms_account_else_the_kernels_token(tpu_emulator, cell, monkeypatch)
    cell("%tpu_down hubby")


def buckets_read_with_the_vms_account_else_the_kernels_token(tpu_emulator, cell, monkeypatch) -> None:
    """On the slice above: a bucket that grants the VMs' service account is read with the token
    their metadata server gives; one that grants only the kernel's user, with a token the kernel
    makes for each file (masked); the manifest holds no token either way."""
    handed: list[str] = []

    def kernel_token() -> str:  # google-auth's refresh is Google's OAuth server: a fresh token per call
        handed.append(f"ya29.kernel-token-{len(handed)}-0123456789")
        return handed[-1]

    def principal(token: str) -> str | None:
        issued = tpu_emulator.emulator.tokens.get(token)  # what the VMs' metadata server gave them
        return issued[2] if issued else ("user:me@example.com" if token in handed else None)

    grants = {"vms-bucket": {default_service_account("proj"), "user:me@example.com"},  # the kernel lists both
              "users-bucket": {"user:me@example.com"}}
    with StorageEmulator(tuple(grants)) as storage, StorageGate(storage.url, principal, grants) as gate:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage.url)  # the objects, put there behind the gate's back
        for name in grants:
            for path, data in OBJECTS.items():
                gcs.Bucket(name).write(f"m/{path}", data)
        monkeypatch.delenv("STORAGE_EMULATOR_HOST")
        monkeypatch.setattr(gcs, "API", gate.url)  # the kernel takes the gate for Cloud Storage itself
        monkeypatch.setattr(listing, "kernel_token", kernel_token)
        vms = cell("%tpu_fetch gs://vms-bucket/m --to ~/gs-vms")
        assert vms.error is None and "host 0 took" in vms.stdout, vms.shown
        listed = len(handed)  # the kernel lists with its own credentials
        users = cell("%tpu_fetch gs://users-bucket/m --to ~/gs-users")
        assert users.error is None and "host 0 took" in users.stdout, users.shown
        reads = [(who, token, path) for who, token, method, path in gate.log if "alt=media" in path]
    vms_reads = [who for who, _, path in reads if "/b/vms-bucket/" in path]
    assert vms_reads and set(vms_reads) == {default_service_account("proj")}, vms_reads
    assert listed == 1 and len(handed) == 2 + len(OBJECTS), "one listing each, then a token per file read"
    granted = [token for who, token, path in reads if who == "user:me@example.com"]
    assert len(granted) == len(set(granted)) == len(OBJECTS), "each file its own token"
    assert all(token not in vms.shown + users.shown for token in handed)
    expected = sorted((p, hashlib.sha256(d).hexdigest()) for p, d in OBJECTS.items())
    assert [files for _, files in host_files(cell, "~/gs-users")] == [expected, expected]
