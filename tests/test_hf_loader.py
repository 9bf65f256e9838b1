"""Tutorial 10's Llama loader against transformers' own LlamaForCausalLM (torch, on the CPU), on the
tutorial's model as it publishes it to the sandbox Hub: two bf16 shards and their index,
rope_scaling of type llama3, no head_dim, tied embeddings. Both read the same files; the logits
agree to float32 rounding, and a loader that ignored the llama3 scaling would not. The code is the
notebook's own (its cells, as stored), not a copy."""
from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "10_hf_finetune_serve.ipynb"


def cell_starting(cells: list, prefix: str) -> str:
    """The source of the notebook's code cell that starts with ``prefix`` (without that line for a magic)."""
    [found] = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).startswith(prefix)]
    source = "".join(found["source"])
    return source.split("\n", 1)[1] if prefix.startswith("%%") else source


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory):
    """The tutorial's model as it makes it (its cell run here), and its loader as a module."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    made = {"work": str(tmp_path_factory.mktemp("tutorial"))}
    exec(cell_starting(cells, "import json, os, secrets"), made)  # noqa: S102 - the notebook's own cell
    llama = types.ModuleType("llama")
    exec(cell_starting(cells, "%%writefile {work}/llama.py"), llama.__dict__)  # noqa: S102
    return made["made"], llama


def test_the_published_copy_is_what_llama_3_checkpoints_are(tutorial):
    folder, llama = tutorial
    config = json.loads(Path(folder, "config.json").read_text())
    index = json.loads(Path(folder, "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == ["model-00001-of-00002.safetensors",
                                                         "model-00002-of-00002.safetensors"]
    assert config["rope_scaling"]["rope_type"] == "llama3" and "head_dim" not in config
    assert config["tie_word_embeddings"] and "lm_head.weight" not in index["weight_map"]
    from safetensors import safe_open

    with safe_open(str(Path(folder, "model-00001-of-00002.safetensors")), "numpy") as f:
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"


@pytest.mark.jax
def test_the_loaders_logits_are_transformers_logits(tutorial):
    import jax.numpy as jnp
    import torch
    import transformers

    folder, llama = tutorial
    config, weights = llama.load(folder)
    ids = np.random.default_rng(0).integers(0, config["vocab_size"], (2, 96))  # past the 64 original positions
    ours = np.asarray(llama.forward(config, weights, {}, jnp.asarray(ids)))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        theirs = model(torch.tensor(ids)).logits.numpy()
    assert ours.shape == theirs.shape == (2, 96, config["vocab_size"])
    assert np.abs(ours - theirs).max() < 1e-4 * np.abs(theirs).max(), np.abs(ours - theirs).max()
    unscaled = {k: v for k, v in config.items() if k != "rope_scaling"}  # what a loader that ignores it computes
    wrong = np.asarray(llama.forward(unscaled, weights, {}, jnp.asarray(ids)))
    assert np.abs(wrong - theirs).max() > 0.01 * np.abs(theirs).max(), "the test would not see the scaling"
