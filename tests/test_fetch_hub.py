"""The Hub stand-in (tpunb/sandbox/hub/hub_server.py) against the real huggingface_hub client, pointed at
it as HF_ENDPOINT points it: snapshots of public and gated repositories, the Hub's errors, tree
pages, and file answers (ETags, commits, ranges) as the client reads them."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import huggingface_hub
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from tpunb.sandbox.hub.hub_server import Hub, HubServer, git_blob_sha1

TOKEN = "hf_standin_token_0123456789"
WEIGHTS = os.urandom(300_000)
FILES = {"config.json": b'{"hidden_size": 8}', "model.safetensors": WEIGHTS, "tokenizer/vocab.json": b'{"a": 0}'}


@pytest.fixture(scope="module")
def hub():
    state = Hub(tokens=(TOKEN,), page_size=2)
    with HubServer(state) as server:
        server.commits = {"public": state.add_repo("org/tiny", FILES),
                          "gated": state.add_repo("org/gated", FILES, gated=True),
                          "v2": state.add_repo("org/tiny", {**FILES, "extra.txt": b"more"}, revision="v2")}
        yield server


@pytest.fixture(autouse=True)
def quiet_client(monkeypatch, tmp_path):
    """No progress bars, and no token but the one a test gives (not the machine's saved login)."""
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


def test_a_gated_repository_downloads_only_with_a_token(hub, tmp_path):
    with pytest.raises(GatedRepoError):
        snapshot_download("org/gated", cache_dir=tmp_path / "a", endpoint=hub.url, token=False)
    before = dict(hub.hub.gets)
    folder = snapshot_download("org/gated", cache_dir=tmp_path / "b", endpoint=hub.url, token=TOKEN)
    for path, data in FILES.items():
        assert (tmp_path / "b" / folder / path).read_bytes() == data
        assert hub.hub.gets[("org/gated", path)] - before.get(("org/gated", path), 0) == 1, path
    assert folder.endswith(hub.commits["gated"])


def test_the_hubs_errors_reach_the_client_as_its_own_exceptions(hub, tmp_path):
    api = HfApi(endpoint=hub.url, token=False)
    with pytest.raises(RevisionNotFoundError):
        snapshot_download("org/tiny", revision="nope", cache_dir=tmp_path, endpoint=hub.url, token=False)
    with pytest.raises(RepositoryNotFoundError) as missing:
        api.model_info("org/absent")
    assert not isinstance(missing.value, GatedRepoError)
    with pytest.raises(GatedRepoError):
        api.auth_check("org/gated")
    HfApi(endpoint=hub.url, token=TOKEN).auth_check("org/gated")
    with pytest.raises(HfHubHTTPError) as refused:
        HfApi(endpoint=hub.url, token="hf_not_a_token_of_this_hub").model_info("org/tiny")
    assert refused.value.response.status_code == 401


def test_tree_listings_come_in_pages_with_the_hubs_ids(hub):
    api = HfApi(endpoint=hub.url, token=False)
    tree = list(api.list_repo_tree("org/tiny", recursive=True, revision="v2"))
    assert [f.path for f in tree] == ["config.json", "extra.txt", "model.safetensors", "tokenizer", "tokenizer/vocab.json"]
    pages = [p for m, p, _ in hub.hub.log if p == "/api/models/org/tiny/tree/v2"]
    assert len(pages) == 3, "five entries at two a page are three requests"
    files = {f.path: f for f in tree if hasattr(f, "blob_id")}
    assert files["config.json"].blob_id == git_blob_sha1(FILES["config.json"]) and files["config.json"].lfs is None
    assert files["model.safetensors"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    top = [f.path for f in api.list_repo_tree("org/tiny", revision="main")]
    assert top == ["config.json", "model.safetensors", "tokenizer"]
    assert api.model_info("org/tiny").sha == hub.commits["public"]
    assert api.model_info("org/tiny", revision="v2").sha == hub.commits["v2"]


def test_file_answers_carry_etags_commits_and_ranges(hub):
    commit = hub.commits["public"]
    small = huggingface_hub.get_hf_file_metadata(huggingface_hub.hf_hub_url("org/tiny", "config.json", endpoint=hub.url),
                                                 token=False)
    assert (small.etag, small.commit_hash, small.size) == (git_blob_sha1(FILES["config.json"]), commit, 18)
    url = huggingface_hub.hf_hub_url("org/tiny", "model.safetensors", endpoint=hub.url)
    large = huggingface_hub.get_hf_file_metadata(url, token=False)
    assert (large.etag, large.size) == (hashlib.sha256(WEIGHTS).hexdigest(), len(WEIGHTS))
    assert not large.location.startswith(hub.url), "LFS files redirect to another origin, as to the Hub's CDN"
    request = urllib.request.Request(url, headers={"Range": "bytes=1000-1999"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 206 and response.read() == WEIGHTS[1000:2000]


def test_a_bandwidth_limit_holds_a_transfer_to_its_rate(hub):
    location = huggingface_hub.get_hf_file_metadata(
        huggingface_hub.hf_hub_url("org/tiny", "model.safetensors", endpoint=hub.url), token=False).location
    hub.hub.rate = 1_000_000  # bytes per second: the 300 kB of weights take 0.3 s
    try:
        started = time.monotonic()
        with urllib.request.urlopen(location, timeout=30) as answer:
            assert answer.read() == WEIGHTS
        assert time.monotonic() - started >= 0.25
    finally:
        hub.hub.rate = None


def test_a_fresh_process_finds_the_stand_in_through_hf_endpoint_and_hf_token(hub, tmp_path):
    """As a user's process does: nothing passed in code, the client reads its environment at import."""
    program = ("import json, os\nfrom huggingface_hub import HfApi, snapshot_download\n"
               "folder = snapshot_download('org/gated')\n"
               "tree = [f.path for f in HfApi().list_repo_tree('org/gated', recursive=True)]\n"
               "print(json.dumps({'folder': folder, 'tree': tree}))\n")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["tree"] == ["config.json", "model.safetensors", "tokenizer", "tokenizer/vocab.json"]
    for path, data in FILES.items():
        assert (Path(answer["folder"]) / path).read_bytes() == data
    assert TOKEN not in done.stdout + done.stderr
