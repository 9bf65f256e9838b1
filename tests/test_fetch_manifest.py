"""Manifests (tpunb/fetch/): each kind of SOURCE listed through the real thing on 127.0.0.1 (the
Hub stand-in read by huggingface_hub, gcp-storage-emulator, an HTTP file), each file then fetched
and verified by the host downloader; every bad input a one-line error naming what to do, and
the token in none of them. Datasets, --exclude, a renamed repository, a token given to
%tpu_secret's prompt or to --secret's, a presigned URL that refuses HEAD, and a bucket that refuses
the host's own account (the kernel's token then, one per file)."""
from __future__ import annotations

import base64
import hashlib
import os

import huggingface_hub.constants
import pytest

from tpunb import colab, manager
from tpunb.sandbox.hub.hub_server import Hub, HubServer, git_blob_sha1
from tpunb.sandbox.storage.cloud_storage import StorageEmulator, StorageGate
from tpunb.errors import UsageError
from tpunb.fetch import storage as listing
from tpunb.fetch.manifest import manifest
from tpunb.fetch.source import parse_source
from tpunb.host import gcs
from tpunb.host.download import Downloads, download
from tpunb.host.fetch import Checker, Entry, FetchError, crc32c

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
        server.commits["data"] = state.add_repo("org/data", {"train.jsonl": b'{"text": "hi"}\n', "README.md": b"# d"},
                                                repo_type="dataset", gated=True)
        server.commits["moved"] = state.add_repo("org/old-name", FILES, gated=True)
        state.rename("org/old-name", "neworg/new-name")
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
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "7")
    found = manifest("hf://org/gated")
    assert found.revision == hub.commits["gated"] and found.total == sum(len(d) for d in FILES.values())
    checks = {e.path: (e.check, e.digest) for e in found.entries}
    assert checks == {"config.json": ("git-sha1", git_blob_sha1(FILES["config.json"])),
                      "model.safetensors": ("sha256", hashlib.sha256(WEIGHTS).hexdigest()),
                      "tokenizer/tokenizer.json": ("git-sha1", git_blob_sha1(FILES["tokenizer/tokenizer.json"]))}
    assert all(f"/resolve/{found.revision}/" in e.url for e in found.entries)
    assert found.timeout == 7.0 and (found.repo_id, found.repo_type, found.ref) == ("org/gated", "model", "main")
    assert found.tree["model.safetensors"] == {"size": len(WEIGHTS), "blob_id": found.tree["model.safetensors"]["blob_id"],
                                               "lfs_sha256": hashlib.sha256(WEIGHTS).hexdigest(),
                                               "lfs_size": len(WEIGHTS)}  # huggingface_hub's tree cache record
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
    # --exclude as ignore_patterns: a folder by its trailing "/", and after --include
    assert [e.path for e in manifest("hf://org/gated", exclude=["tokenizer/"]).entries] == ["config.json",
                                                                                          "model.safetensors"]
    assert [e.path for e in manifest("hf://org/gated", include=["*.json"], exclude=["config*"]).entries] == [
        "tokenizer/tokenizer.json"]
    assert one_line(lambda: manifest("hf://org/gated", include=["*.json"], exclude=["*"])).startswith(
        "--include *.json --exclude * match none of the 3 files")


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
    assert "is not a Hub repository" in one_line(lambda: parse_source("hf://a/b/c"))
    assert "is not a Hub repository" in one_line(lambda: parse_source("hf://datasets/a/b/c"))
    assert parse_source("hf://datasets/org/data").repo_type == "dataset"
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


def test_a_dataset_is_listed_as_a_dataset_with_its_files_under_datasets(hub, monkeypatch, tmp_path):
    assert "gated and the kernel has no Hugging Face token" in one_line(lambda: manifest("hf://datasets/org/data"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    found = manifest("hf://datasets/org/data")
    assert (found.repo_type, found.repo_id, found.revision) == ("dataset", "org/data", hub.commits["data"])
    assert all(e.url.startswith(f"{hub.url}/datasets/org/data/resolve/{found.revision}/") for e in found.entries)
    for entry in found.entries:
        download(entry, str(tmp_path))
    assert (tmp_path / "train.jsonl").read_bytes() == b'{"text": "hi"}\n'
    assert hub.hub.gets[("datasets/org/data", "train.jsonl")] == 1
    assert "hf://org/data is not at" in one_line(lambda: manifest("hf://org/data")), "not a model of that name"


def test_a_renamed_repository_is_fetched_under_its_new_name_with_the_token(hub, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    found = manifest("hf://org/old-name")  # the Hub redirects the API (huggingface_hub follows it, token kept)
    assert found.repo_id == "neworg/new-name" and found.revision == hub.commits["moved"]
    assert all(f"{hub.url}/neworg/new-name/resolve/" in e.url for e in found.entries)
    for entry in found.entries:  # urllib drops the token on a redirect: the new name needs none
        download(entry, str(tmp_path))
    assert (tmp_path / "model.safetensors").read_bytes() == WEIGHTS
    old = Entry("config.json", len(FILES["config.json"]), f"{hub.url}/org/old-name/resolve/main/config.json",
                "git-sha1", git_blob_sha1(FILES["config.json"]), {"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(FetchError) as dropped:  # what the old name's URL did: the redirect loses the token
        download(old, str(tmp_path / "old"))
    assert "HTTP 401 (GatedRepo)" in str(dropped.value)


def test_a_token_typed_at_tpu_secrets_prompt_lists_a_gated_repository(hub, monkeypatch):
    import getpass

    monkeypatch.setattr(getpass, "getpass", lambda prompt="": TOKEN)  # what the user types at the prompt
    monkeypatch.setattr(colab, "user_secret", lambda name: None)
    assert manager.secret("HF_TOKEN") == ["HF_TOKEN"] and "HF_TOKEN" not in os.environ
    found = manifest("hf://org/gated")
    assert found.revision == hub.commits["gated"]
    assert all(e.headers == {"Authorization": f"Bearer {TOKEN}"} for e in found.entries)


def test_a_token_given_with_secret_on_a_launch_lists_a_gated_repository(hub, monkeypatch):
    import getpass

    monkeypatch.setattr(getpass, "getpass", lambda prompt="": TOKEN)  # typed at --secret's prompt
    monkeypatch.setattr(colab, "user_secret", lambda name: None)
    assert manager.parse_env(None, ["HF_TOKEN"]) == {"HF_TOKEN": TOKEN} and "HF_TOKEN" not in os.environ
    assert not manager.MANAGER.secrets  # --secret is not %tpu_secret: only the kernel's named secrets hold it
    found = manifest("hf://org/gated")
    assert all(e.headers == {"Authorization": f"Bearer {TOKEN}"} for e in found.entries)


def test_a_presigned_url_that_refuses_head_is_listed_with_a_get_of_its_first_byte(hub):
    location = huggingface_hub.get_hf_file_metadata(
        huggingface_hub.hf_hub_url("org/gated", "model.safetensors", endpoint=hub.url), token=TOKEN).location
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as refused:  # signed for GET, as S3 signs it
        urllib.request.urlopen(urllib.request.Request(location, method="HEAD"), timeout=10)
    assert refused.value.code == 403
    mark = len(hub.hub.log)
    [entry] = manifest(location).entries
    assert (entry.size, entry.digest) == (len(WEIGHTS), f'"{hashlib.sha256(WEIGHTS).hexdigest()}"')
    assert [(m, r) for m, p, r in hub.hub.log[mark:]] == [("GET", "bytes=0-0")]
    assert "sig=" not in str(manifest(location)), "a signed URL's query is not shown"


def test_a_bucket_that_refuses_the_hosts_account_is_read_with_the_kernels_token_one_per_file(storage, tmp_path,
                                                                                            monkeypatch):
    bucket_name = "kernel-only"
    storage.create_bucket(bucket_name)
    handed = []

    def kernel_token() -> str:  # google-auth's refresh is Google's OAuth server: a fresh token per call
        handed.append(f"ya29.kernel-{len(handed)}")
        return handed[-1]

    issued = {"ya29.vm-account": "serviceAccount:vm@proj.iam.gserviceaccount.com"}
    with StorageGate(storage.url, lambda token: issued.get(token) or ("user:me@example.com" if token in handed else None),
                     {bucket_name: {"user:me@example.com"}}) as gate:
        monkeypatch.setattr(gcs, "API", gate.url)  # the kernel takes the gate for Cloud Storage itself
        monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
        monkeypatch.setattr(listing, "kernel_token", kernel_token)
        bucket = gcs.Bucket(bucket_name, token=kernel_token)
        for path, data in FILES.items():
            bucket.write(f"m/{path}", data)
        handed.clear()
        found = manifest(f"gs://{bucket_name}/m")
        assert all(e.auth == "gcs" and e.headers == {} for e in found.entries), "no token frozen in the manifest"
        asked = []

        def token(index: int, entry: Entry, refused: bool) -> str:
            if not refused:
                return "ya29.vm-account"  # the VM's own, from its metadata server
            asked.append(entry.path)
            return kernel_token()

        done = Downloads(str(tmp_path), token=token).run(list(enumerate(found.entries)))
    assert len(done) == 3 and all((tmp_path / p).read_bytes() == d for p, d in FILES.items())
    assert sorted(asked) == sorted(FILES), "the kernel's token asked once per file"
    media = [(who, token) for who, token, method, path in gate.log if "alt=media" in path]
    assert {t for who, t in media if who == "user:me@example.com"} == set(handed[-3:]), "a fresh token per file"
