"""%tpu_fetch puts a Hub repository where Hugging Face's own tools look, on two real sshd hosts
(each a home of its own, this machine's Python, which has transformers and torch), from the Hub
stand-in: a gated model whose token was typed at %tpu_secret's prompt lands once per slice in each
host's Hugging Face cache as that host's environment resolves it (host 1 has HF_HOME), in
huggingface_hub's layout, where ``from_pretrained`` and ``snapshot_download`` find it with
HF_HUB_OFFLINE=1 and not a byte more comes from the Hub; a dataset the same; ``--exclude``
leaves Llama's ``original/`` out; and ``--to`` leaves what ``hf download --local-dir`` leaves, so
``hf_hub_download(..., local_dir=...)`` neither downloads nor hashes the file again."""
from __future__ import annotations

import getpass
import hashlib
import json
import os

import huggingface_hub.constants
import pytest
from safetensors.numpy import load

from tpunb import colab
from tpunb.sandbox.hub.hub_server import Hub, HubServer
from tests.test_fetch_sources import connect, homes
from tests.tiny_llama import tiny_llama_files

pytestmark = pytest.mark.sandbox

TOKEN = "hf_cache_token_0123456789abcdef"
MODEL = tiny_llama_files()
#: what a Llama repository also holds: the original checkpoint, which doubles a download
FILES = {**MODEL, "README.md": b"# tiny llama", "original/consolidated.00.pth": os.urandom(50_000)}
DATA = {"train.jsonl": b'{"messages": [{"role": "user", "content": "hi"}]}\n', "README.md": b"# chat"}

#: run on each host, in a fresh process with the host's environment and HF_HUB_OFFLINE=1: the
#: model through transformers, the snapshot and the dataset through huggingface_hub
OFFLINE = r'''%%on_tpu
import json, os, subprocess, sys
program = """
import json, os, torch, transformers, huggingface_hub as hf
model = transformers.AutoModelForCausalLM.from_pretrained("org/tiny-llama")
logits = model(torch.tensor([[3, 1, 4, 1, 5]])).logits
try:  # the whole repository was not fetched: huggingface_hub knows from the tree listing left beside it
    hf.snapshot_download("org/tiny-llama")
    whole = "returned"
except Exception as exc:
    whole = type(exc).__name__
print(json.dumps({"cache": hf.constants.HF_HUB_CACHE, "params": sum(p.numel() for p in model.parameters()),
                  "logits": logits.shape[-1], "whole": whole,
                  "model": hf.snapshot_download("org/tiny-llama", ignore_patterns=["original/*"]),
                  "data": hf.snapshot_download("org/chat", repo_type="dataset")}))
"""
done = subprocess.run([sys.executable, "-c", program], env={**os.environ, "HF_HUB_OFFLINE": "1"},
                      capture_output=True, text=True)
open(os.path.expanduser("~/answer.txt"), "w").write(done.stdout if done.returncode == 0 else done.stderr[-3000:])
'''

#: run on each host: hf_hub_download into the --to folder with the Hub in reach; hashing is an error
LOCAL_DIR = r'''%%on_tpu
import json, os, subprocess, sys
program = """
import json, os, sys
import huggingface_hub as hf, huggingface_hub.file_download as fd
from huggingface_hub._local_folder import read_download_metadata
from pathlib import Path
def refuse(*args, **kwargs):
    raise AssertionError("hashed the file again")
fd.sha_fileobj = refuse
local = os.path.expanduser("~/local")
kept = read_download_metadata(Path(local), "model.safetensors")
path = hf.hf_hub_download("org/tiny-llama", "model.safetensors", local_dir=local, endpoint=sys.argv[1], token=sys.argv[2])
pinned = hf.hf_hub_download("org/tiny-llama", "config.json", local_dir=local, revision=kept.commit_hash,
                            endpoint="http://127.0.0.1:9", token=False)
print(json.dumps({"path": path, "pinned": pinned, "commit": kept.commit_hash, "etag": kept.etag}))
"""
done = subprocess.run([sys.executable, "-c", program, ENDPOINT, TOKEN], capture_output=True, text=True)
open(os.path.expanduser("~/answer.txt"), "w").write(done.stdout if done.returncode == 0 else done.stderr[-3000:])
'''


@pytest.fixture(scope="module")
def hub():
    state = Hub(tokens=(TOKEN,))
    with HubServer(state) as server:
        server.commits = {"model": state.add_repo("org/tiny-llama", FILES, gated=True),
                          "data": state.add_repo("org/chat", DATA, repo_type="dataset")}
        yield server


@pytest.fixture
def kernel(monkeypatch, hub, tmp_path):
    """A kernel pointed at the stand-in, with no token of its own: one is typed at %tpu_secret's prompt."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": TOKEN)
    monkeypatch.setattr(colab, "user_secret", lambda name: None)


def results(cell, sshd, code: str) -> list:
    """Each host's answer: the JSON its program printed (left in its home), or the end of its errors."""
    run = cell(code)
    assert run.error is None, run.shown
    assert all((home / "answer.txt").exists() for home in homes(sshd)), run.shown
    texts = [(home / "answer.txt").read_text() for home in homes(sshd)]
    return [json.loads(text.strip().splitlines()[-1]) if text.startswith("{") else text for text in texts]


@pytest.mark.fresh_slice
def test_without_to_every_hosts_cache_holds_it_where_huggingface_finds_it_offline(cell, sshd, ssh_key, monkeypatch,
                                                                                  hub, kernel):
    connect(sshd, ssh_key, monkeypatch, "cached")
    home0, home1 = homes(sshd)
    assert cell("%%on_tpu --hosts 1\nimport os\nos.environ['HF_HOME'] = os.path.expanduser('~/hf-home')").error is None
    assert cell("%tpu_secret HF_TOKEN").error is None  # typed at the prompt: not in the kernel's environment
    before = dict(hub.hub.gets)
    run = cell("%tpu_fetch hf://org/tiny-llama --exclude original/")
    assert run.error is None and TOKEN not in run.shown, run.shown
    assert "host 0 took" in run.stdout and "relayed to host 1" in run.stdout, run.stdout
    assert f"at the Hugging Face cache (host 0: {home0}/.cache/huggingface/hub; host 1: {home1}/hf-home/hub)" \
        in run.stdout, run.stdout
    moved = {path: hub.hub.gets[("org/tiny-llama", path)] - before.get(("org/tiny-llama", path), 0) for path in FILES}
    assert moved == {**{p: 1 for p in MODEL}, "README.md": 1, "original/consolidated.00.pth": 0}, moved
    commit = hub.commits["model"]
    for cache in (home0 / ".cache/huggingface/hub", home1 / "hf-home/hub"):
        repo = cache / "models--org--tiny-llama"
        assert (repo / "refs/main").read_text() == commit
        weights = repo / "snapshots" / commit / "model.safetensors"
        assert os.readlink(weights) == f"../../blobs/{hashlib.sha256(MODEL['model.safetensors']).hexdigest()}"
        assert weights.read_bytes() == MODEL["model.safetensors"] and not (repo / "snapshots" / commit / "original").exists()
        listed = json.loads((repo / "trees" / f"{commit}.json").read_text())
        assert listed["format_version"] == 1 and sorted(listed["files"]) == sorted(FILES)
        assert not list(repo.rglob("*.partial")) and not (repo / ".cache/tpunb/hosts").exists()
    assert cell("%tpu_fetch hf://datasets/org/chat").error is None
    mark = dict(hub.hub.gets)
    for host, found in enumerate(results(cell, sshd, OFFLINE)):
        assert isinstance(found, dict), found
        assert found["cache"] == str([home0 / ".cache/huggingface/hub", home1 / "hf-home/hub"][host])
        assert found["params"] == sum(a.size for a in load(MODEL["model.safetensors"]).values())
        assert found["model"].endswith(f"models--org--tiny-llama/snapshots/{commit}")
        assert found["whole"] == "IncompleteSnapshotError", "as after snapshot_download(ignore_patterns=...)"
        assert found["data"].endswith(f"datasets--org--chat/snapshots/{hub.commits['data']}")
    assert dict(hub.hub.gets) == mark, "the hosts found everything without the Hub"
    again = cell("%tpu_fetch hf://org/tiny-llama --exclude original/")
    assert again.error is None and "already there: no bytes moved" in again.stdout, again.shown
    # --to: as hf download --local-dir leaves it
    assert cell("%tpu_fetch hf://org/tiny-llama --to ~/local --exclude original/").error is None
    mark = len(hub.hub.log)
    for found in results(cell, sshd, LOCAL_DIR.replace("ENDPOINT", repr(hub.url)).replace("TOKEN", repr(TOKEN))):
        assert isinstance(found, dict), found
        assert (found["commit"], found["etag"]) == (commit, hashlib.sha256(MODEL["model.safetensors"]).hexdigest())
        assert found["path"].endswith("/local/model.safetensors") and found["pinned"].endswith("/local/config.json")
    assert "GET" not in [m for m, p, _ in hub.hub.log[mark:]], "nothing downloaded again"
