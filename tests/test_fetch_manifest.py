"""Manifests (tpunb/fetch/): each kind of SOURCE listed through the real thing on 127.0.0.1 (the
Hub stand-in read by huggingface_hub, gcp-storage-emulator, an HTTP file), each file then fetched
and verified by the host downloader; every bad input a one-line error naming what to do, and
the token in none of them."""
from __future__ import annotations

import base64
import hashlib
import os

import huggingface_hub.constants
import pytest

from tpunb.emulator.hub import Hub, HubServer, git_blob_sha1
from tpunb.emulator.storage import StorageEmulator
from tpunb.errors import UsageError
from tpunb.fetch.manifest import manifest
from tpunb.fetch.source import parse_source
from tpunb.host import gcs
from tpunb.host.fetch import Checker, Entry, FetchError, crc32c, download

TOKEN = "hf_manifest_token_0123456789"
OTHER = "hf_other_account_token_98765"
WEIGHTS = os.urandom(200_000)
FILES = {"config.json": b'{"layers": 2}', "model.safetensors": WEIGHTS, "tokenizer/tokenizer.json": b'{"v": 1}'}
BUCKET = "fetch-bucket"


@pytest.fixture(scope="module")
def hub():
    state = Hub(tokens=(TOKEN, OTHER))
    with HubServer(state) as server:
        server.commits = {"gated": state.add_repo("org/gated", FILES, gated=True),
                          "private": state.add_repo("org/private", FILES, private=True),
                          "granted": state.add_repo("org/granted", FILES, gated=True, granted=(TOKEN,)),
                          "v1": state.add_repo("org/gated", {"config.json": b"{}"}, revision="v1", gated=True)}
        state.repos["org/gated"].refs["main"] = server.commits["gated"]
        yield server


@pytest.fixture(autouse=True)
def kernel_env(monkeypatch, hub, tmp_path):
    """The kernel as a user sets it: HF_ENDPOINT at the stand-in, a token only where a test sets one."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


def one_line(call) -> str:
    with pytest.raises(UsageError) as caught:
        call()
    text = str(caught.value)
    assert "\n" not in text and TOKEN not in text and TOKEN not in repr(caught.value)
    error = caught.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__), "no traceback under ours"
    return text


def test_a_gated_hub_repository_becomes_verified_entries_at_its_commit(hub, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "7")
    found = manifest("hf://org/gated")
    assert found.revision == hub.commits["gated"] and found.total == sum(len(d) for d in FILES.values())
    checks = {e.path: (e.check, e.digest) for e in found.entries}
    assert checks == {"config.json": ("git-sha1", git_blob_sha1(FILES["config.json"])),
                      "model.safetensors": ("sha256", hashlib.sha256(WEIGHTS).hexdigest()),
                      "tokenizer/tokenizer.json": ("git-sha1", git_blob_sha1(FILES["tokenizer/tokenizer.json"]))}
    assert all(f"/resolve/{found.revision}/" in e.url for e in found.entries)
    assert found.settings.items() >= {"HF_ENDPOINT": hub.url, "HF_HUB_ETAG_TIMEOUT": "7"}.items()
    assert all(k == "HF_ENDPOINT" or k.startswith("HF_HUB_") for k in found.settings)
    for text in (repr(found), str(found), repr(found.entries)):
        assert TOKEN not in text
    for entry in found.entries:
        assert download(Entry.from_wire(entry.to_wire()), str(tmp_path)).moved == entry.size
        assert (tmp_path / entry.path).read_bytes() == FILES[entry.path]
    older = manifest("hf://org/gated", revision="v1")
    assert older.revision == hub.commits["v1"] and [e.path for e in older.entries] == ["config.json"]


def test_include_picks_files_as_huggingface_hub_does(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert [e.path for e in manifest("hf://org/gated", include=["*.json"]).entries] == [
        "config.json", "tokenizer/tokenizer.json"]
    assert [e.path for e in manifest("hf://org/gated", include=["tokenizer/", "*.safetensors"]).entries] == [
        "model.safetensors", "tokenizer/tokenizer.json"]
    text = one_line(lambda: manifest("hf://org/gated", include=["*.gguf"]))
    assert text == ("--include *.gguf matches none of the 3 files of hf://org/gated (config.json, model.safetensors, "
                    "tokenizer/tokenizer.json): fix the pattern")


def test_hub_sources_that_cannot_be_read_are_one_line_each(monkeypatch, hub):
    gated = one_line(lambda: manifest("hf://org/gated"))
    assert gated.startswith("hf://org/gated is gated and the kernel has no Hugging Face token: set HF_TOKEN"), gated
    private = one_line(lambda: manifest("hf://org/private"))
    assert private == (f"hf://org/private is not at {hub.url}, or it is private: check the name, or set HF_TOKEN in "
                       "the kernel (or %tpu_secret HF_TOKEN) to a token that can read it")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert manifest("hf://org/private").revision == hub.commits["private"]
    wrong = one_line(lambda: manifest("hf://org/gated", revision="v9"))
    assert wrong == "hf://org/gated has no revision 'v9': give a branch, tag or commit that exists (--revision)"
    assert "or this token cannot see it" in one_line(lambda: manifest("hf://org/absent"))
    assert manifest("hf://org/granted").revision == hub.commits["granted"]
    monkeypatch.setenv("HF_TOKEN", OTHER)
    ungranted = one_line(lambda: manifest("hf://org/granted"))
    assert ungranted == (f"hf://org/granted is gated and this token has no access: ask for access at {hub.url}/"
                         "org/granted, or use a token of an account that has it"), ungranted
    assert OTHER not in ungranted
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert one_line(lambda: manifest("hf://org/gated")).endswith("HF_HUB_OFFLINE is set in the kernel (unset it)")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_TOKEN", "hf_a_token_the_hub_never_issued")
    refused = one_line(lambda: manifest("hf://org/gated"))
    assert "refused the kernel's Hugging Face token" in refused and "hf_a_token" not in refused


def test_sources_that_are_not_sources_are_one_line_each():
    assert one_line(lambda: parse_source("s3://b/k")).startswith("cannot fetch 's3://b/k': give hf://ORG/NAME")
    assert "--revision is for hf:// sources only" in one_line(lambda: parse_source("gs://b/p", revision="main"))
    assert "is not a model repository" in one_line(lambda: parse_source("hf://a/b/c"))
    assert "names no bucket" in one_line(lambda: parse_source("gs://"))


@pytest.fixture(scope="module")
def storage():
    with StorageEmulator((BUCKET,)) as server:
        yield server


def test_cloud_storage_objects_become_entries_checked_by_md5(storage, monkeypatch, tmp_path):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage.url)
    bucket = gcs.Bucket(BUCKET)
    for path, data in FILES.items():
        bucket.write(f"models/tiny/{path}", data)
    bucket.write("models/tinyother/x.bin", b"not under the folder")
    found = manifest(f"gs://{BUCKET}/models/tiny")
    assert [e.path for e in found.entries] == sorted(FILES)
    assert {e.check for e in found.entries} == {"md5"}
    assert found.entries[1].digest == base64.b64encode(hashlib.md5(WEIGHTS).digest()).decode()
    for entry in found.entries:
        download(entry, str(tmp_path))
        assert (tmp_path / entry.path).read_bytes() == FILES[entry.path]
    [listed] = bucket.items("models/tiny/model.safetensors")  # a composite object has a crc32c only
    by_crc = Entry("by-crc.bin", len(WEIGHTS), found.entries[1].url, "crc32c", listed["crc32c"])
    assert download(by_crc, str(tmp_path)).moved == len(WEIGHTS)
    one = manifest(f"gs://{BUCKET}/models/tiny/config.json")
    assert [(e.path, e.size) for e in one.entries] == [("config.json", len(FILES["config.json"]))]
    assert one_line(lambda: manifest(f"gs://{BUCKET}/nothing/here")).startswith(f"nothing is under gs://{BUCKET}/nothing")
    assert "cannot list gs://no-such-bucket/x" in one_line(lambda: manifest("gs://no-such-bucket/x"))


def test_crc32c_is_checked_as_cloud_storage_gives_it():
    data = b"123456789"
    assert crc32c(data) == 0xE3069283 == crc32c(data[4:], crc32c(data[:4])), "the Python fallback hosts may use"
    entry = Entry("x", len(data), "", "crc32c", base64.b64encode(0xE3069283.to_bytes(4, "big")).decode())
    checker = Checker(entry)
    checker.update(data)
    assert checker.mismatch() is None
    wrong = Checker(entry)
    wrong.update(b"123456780")
    assert "its crc32c is" in wrong.mismatch()


def test_an_https_file_is_checked_by_size_and_etag(hub, tmp_path):
    hub.hub.add_repo("org/public", {"notes.txt": b"plain text"})
    url = f"{hub.url}/org/public/resolve/main/notes.txt"
    found = manifest(url)
    [entry] = found.entries
    assert (entry.path, entry.size, entry.check, entry.digest) == ("notes.txt", 10, "etag", f'"{git_blob_sha1(b"plain text")}"')
    assert download(entry, str(tmp_path)).moved == 10 and download(entry, str(tmp_path)).already
    changed = Entry(entry.path, entry.size, url, "etag", '"an-older-etag"')
    (tmp_path / "notes.txt").unlink()
    with pytest.raises(FetchError) as moved_on:
        download(changed, str(tmp_path))
    assert "changed since it was listed" in str(moved_on.value) and not (tmp_path / "notes.txt").exists()
    assert "answered HTTP 404" in one_line(lambda: manifest(f"{hub.url}/org/public/resolve/main/absent.txt"))
    assert "names no file" in one_line(lambda: manifest(f"{hub.url}/"))
