"""Tutorial 10's "real v6e-8 with vLLM" path, each command as the notebook prints it, on the cloud
sandbox as far as it goes without a TPU: a fresh v6e-8 VM image (its Python 3.10, uv, no framework)
made by the Cloud TPU API stand-in, the Hub stand-in serving the tutorial's own small copy under the
real model's name (gated, sharded, bf16, with Meta's original/ checkpoint beside it). The token
comes from %tpu_secret's prompt; the fetch leaves original/ out and fills the host's Hugging Face
cache; the tutorial's cells load it from there by name in bf16 and save a PEFT adapter in
~/adapters/mine; %tpu_restart leaves no process holding the chips; the %%tpu_run cell makes
vllm-tpu's own Python 3.12 environment (its last line, the install of vllm-tpu itself, is left out:
gigabytes of TPU wheels); %tpu_serve starts `~/vllm-env/bin/vllm serve` exactly as written, which
here is the tutorial's own server taking vLLM's arguments (vLLM cannot run without a TPU); and
%tpu_bench's line runs with its client on the host (fewer requests and tokens: a CPU toy)."""
from __future__ import annotations

import getpass
import json
import os
import re
import stat
from pathlib import Path

import huggingface_hub.constants
import pytest

from tpunb import colab
from tpunb.sandbox.hub.hub_server import Hub, HubServer
from tpunb.sandbox.hosts.image import kernel_prefix
from tests.compute_fixture import cloud, sandbox  # noqa: F401 - cloud is a fixture
from tests.test_hf_loader import NOTEBOOK, cell_starting

pytestmark = [pytest.mark.sandbox, pytest.mark.jax]

TOKEN = "hf_real_path_token_0123456789abcdef"
MODEL = "meta-llama/Llama-3.2-3B-Instruct"


def notebook() -> tuple[list, list[str]]:
    """The notebook's cells, and the commands of its real-slice section (its code block), in order."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    [section] = ["".join(c["source"]) for c in cells if "".join(c["source"]).startswith("## The same on a real v6e-8")]
    block = section.split("```\n", 1)[1].split("\n```", 1)[0]
    commands: list[list[str]] = []
    for line in block.splitlines():  # a line magic each; a %% cell to the next magic; comments together
        joins = commands and ((commands[-1][0].startswith("%%") and not line.startswith(("%", "#"))) or
                              (commands[-1][0].startswith("#") and line.startswith("#")))
        if joins:
            commands[-1].append(line)
        else:
            commands.append([line])
    return cells, ["\n".join(lines) for lines in commands]


@pytest.fixture(scope="module")
def box():
    """One fresh VM image host; uv finds Python 3.12 there as it would after downloading it on a VM."""
    from tpunb.sandbox.box import start_sandbox

    made = start_sandbox(hosts=1, create_seconds=0.3, pythons=[kernel_prefix(), "3.12"])
    made.emulator.timings(delete_seconds=0.1, queue_seconds=0.1)
    yield made
    made.stop()


@pytest.fixture
def hub(tmp_path):
    cells, _ = notebook()
    made = {"work": str(tmp_path / "made-here")}
    os.makedirs(made["work"])
    exec(cell_starting(cells, "import json, os, secrets"), made)  # noqa: S102 - the tutorial's own cell
    files = {name: Path(made["made"], name).read_bytes() for name in os.listdir(made["made"])}
    files["original/consolidated.00.pth"] = os.urandom(100_000)  # Meta's own checkpoint, in every Llama repo
    with HubServer(Hub(tokens=(TOKEN,))) as server:
        server.commit = server.hub.add_repo(MODEL, files, gated=True)
        server.text = made["text"]
        yield server


@pytest.mark.fresh_slice
def test_the_real_v6e8_path_runs_on_the_sandbox_as_far_as_it_goes(cloud, cell, ip, hub, monkeypatch, tmp_path):
    cells, commands = notebook()
    launch, secret, fetch, push, sync, finetune, restart, venv, serve, bench = commands
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(getpass, "getpass", lambda prompt="": TOKEN)  # typed at %tpu_secret's prompt
    monkeypatch.setattr(colab, "user_secret", lambda name: None)
    assert cell(launch).error is None
    home = cloud.sshd.home(cloud.sshd.addresses[0])
    assert cell(secret).error is None
    fetched = cell(fetch)
    assert fetched.error is None and "host 0 took" in fetched.stdout and TOKEN not in fetched.shown, fetched.shown
    repo = home / ".cache/huggingface/hub/models--meta-llama--Llama-3.2-3B-Instruct"
    assert not (repo / "snapshots" / hub.commit / "original").exists() and \
        (repo / "snapshots" / hub.commit / "model.safetensors.index.json").exists()
    work = tmp_path / "work"  # the tutorial's folder: llama.py and server.py
    work.mkdir()
    (work / "llama.py").write_text(cell_starting(cells, "%%writefile {work}/llama.py"))
    (work / "server.py").write_text(cell_starting(cells, "%%writefile {work}/server.py"))
    ip.user_ns.update(work=str(work), text=hub.text)
    assert cell(push).error is None and sync == "%tpu_sync $work $work"
    # the sandbox's hosts share this machine's disk outside their homes (a VM has its own): the same path
    # would be copied onto itself, so the folder goes to the host's home, and the host's `work` names it there
    synced = cell(f"%tpu_sync $work {home}/work")
    assert synced.error is None and (home / "work/llama.py").exists(), synced.shown
    assert cell("%%on_tpu\nimport os\nwork = os.path.expanduser('~/work')").error is None
    # "the cells above from 'Load it sharded' on", as the comment says: the real name, bf16, ~/adapters/mine
    assert finetune.startswith("# the cells above")
    load = cell_starting(cells, "%%on_tpu\nimport json, os, sys").replace(
        '"tutorial/tiny-llama", local_files_only=True', f'"{MODEL}", local_files_only=True, ignore_patterns=["original/*"]'
    ).replace("llama.load(folder, mesh)", "llama.load(folder, mesh, dtype=jnp.bfloat16)")
    assert MODEL in load and "bfloat16" in load and 'ignore_patterns=["original/*"]' in finetune
    loaded = cell("%%on_tpu\n" + load.replace("os.environ['HF_HOME']", "os.path.expanduser('~/.cache/huggingface')"))
    assert loaded.error is None and "21 tensors" in loaded.stdout and "rope llama3" in loaded.stdout, loaded.shown
    assert cell("%%on_tpu\n" + cell_starting(cells, "%%on_tpu\nimport jinja2")).error is None
    save = cell_starting(cells, "%%on_tpu\nfrom jax.experimental").replace(
        'os.path.join(work, "adapter")', 'os.path.expanduser("~/adapters/mine")')
    assert cell("%%on_tpu\n" + save).error is None
    assert (home / "adapters/mine/adapter_model.safetensors").exists()
    restarted = cell(restart)
    assert restarted.error is None and "JAX is starting again" not in restarted.stdout, restarted.shown
    free = cell("%%on_tpu\nimport sys\n'jax' in sys.modules")
    assert free.error is None and free.shown.strip() == "False", free.shown  # no process of ours holds the chips
    *made, install = venv.splitlines()
    assert install.endswith("$UV pip install vllm-tpu")
    assert cell("\n".join(made)).error is None
    python = cell("%tpu_run ~/vllm-env/bin/python --version")
    assert "Python 3.12" in python.stdout, python.shown
    # vLLM itself needs a TPU: in its place, the tutorial's server, which takes vllm serve's arguments
    shim = home / "vllm-env/bin/vllm"
    shim.write_text(f"#!/bin/sh\nexec {home}/.tpunb/env/bin/python3 {home}/work/server.py \"$@\"\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    served = cell(serve.replace("--timeout 1800", "--timeout 300"))
    assert served.error is None, served.shown
    measured = cell(re.sub(r"--output-len \d+", "--output-len 4", bench) + " --requests 2")
    assert measured.error is None and "mine" in measured.stdout and "host 0" in measured.stdout, measured.shown
    cell("%tpu_down llama")
