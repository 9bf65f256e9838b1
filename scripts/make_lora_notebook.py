"""Writes notebooks/05_lora_finetune.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_lora_notebook.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import BLOCK, write

cells = [
    new_markdown_cell(
        "# LoRA fine-tuning across hosts, then merge\n\n"
        "The workflow of fine-tuning Gemma on a TPU v5p-8 with JAX (LoRA adapters on a frozen pretrained "
        "model, sharded over the chips, merged back into the weights for serving), at toy scale: a small "
        "character-level transformer on a simulated **v4-16 (2 hosts x 4 chips)**. At the end, the planner "
        "says what the same job needs at full size.\n\n"
        "**On a real slice**, configure a Google Cloud project (`gcloud auth application-default login`; in "
        "Colab `tpunb.colab.authenticate(\"my-project\")`) and launch with `%tpu_launch v5p-8 --zone us-east5-a` "
        "(one host, 4 chips) or `%tpu_launch v4-16 --zone us-central2-b`; the cells run unchanged."),
    new_code_cell("%load_ext tpunb\n%tpu_launch v4-16 --name lora"),
    new_code_cell('from importlib.resources import files\n\n'
                  'text = (files("tpunb") / "data" / "coriolanus.txt").read_text()   # Shakespeare, public domain\n'
                  "%tpu_push text"),
    new_markdown_cell(
        "## A small pretrained model\n\n"
        "One transformer block over 64 characters, pretrained for a few steps on the text as written. Every "
        "host reads its own half of the text; one mesh axis, `data`, spans the 8 devices of both hosts and "
        "splits the batch, and the weights are replicated."),
    new_code_cell(
        "%%on_tpu\nimport functools\n\nimport jax, jax.numpy as jnp, numpy as np, optax\nfrom flax import nnx\n"
        "from jax.sharding import AxisType, NamedSharding, PartitionSpec as P\n\n"
        "SEQ, BATCH = 64, 32\n"
        "chars = sorted(set(text + text.upper()))\n"
        "host, hosts = jax.process_index(), jax.process_count()\n"
        "def encode(s):\n"
        "    return np.array_split(np.array([chars.index(c) for c in s], dtype=np.int32), hosts)[host]\n"
        "plain, capitals = encode(text), encode(text.upper())   # this host's half of each\n\n"
        + BLOCK +
        "class CharLM(nnx.Module):\n"
        "    def __init__(self, vocab, d=64, heads=4, *, rngs):\n"
        "        self.embed = nnx.Embed(vocab, d, rngs=rngs)\n"
        "        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (SEQ, d)))\n"
        "        self.block = Block(d, heads, rngs)\n"
        "        self.norm = nnx.RMSNorm(d, rngs=rngs)\n\n"
        "    def __call__(self, ids):\n"
        "        return self.embed.attend(self.norm(self.block(self.embed(ids) + self.pos[: ids.shape[1]])))\n\n"
        "def loss_fn(model, x, y):\n"
        "    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()\n\n"
        'mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))\n'
        'batch_sharding = NamedSharding(mesh, P("data"))\n\n'
        "def batch(tokens, step):\n"
        "    starts = np.random.default_rng([step, host]).integers(0, len(tokens) - SEQ - 1, BATCH // hosts)\n"
        "    windows = np.stack([tokens[s : s + SEQ + 1] for s in starts])\n"
        "    inputs, targets = windows[:, :-1], windows[:, 1:]\n"
        "    return [jax.make_array_from_process_local_data(batch_sharding, w) for w in (inputs, targets)]\n\n"
        "def replicate(module):\n"
        "    state = nnx.state(module)\n"
        "    nnx.update(module, jax.device_put(state, jax.tree.map(lambda a: NamedSharding(mesh, P()), state)))\n\n"
        "@functools.partial(nnx.jit, static_argnums=0)\n"
        "def create(seed):\n"
        "    return CharLM(len(chars), rngs=nnx.Rngs(seed))\n\n"
        "@nnx.jit\n"
        "def pretrain_step(model, opt, x, y):\n"
        "    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)\n"
        "    opt.update(model, grads)\n"
        "    return loss\n\n"
        "model = create(0)\n"
        "opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)\n"
        "replicate(model)\n"
        "replicate(opt)                                      # weights and Adam state on all 8 devices\n"
        "for step in range(20):\n"
        "    loss = pretrain_step(model, opt, *batch(plain, step))\n"
        "new_task = float(nnx.jit(loss_fn)(model, *batch(capitals, 0)))\n"
        'print(f"pretrained: loss {float(loss):.2f} on the text, {new_task:.2f} on it in capitals (the new task)")'),
    new_markdown_cell(
        "## Add LoRA adapters, freeze the rest\n\n"
        "`nnx.LoRA(..., base_module=layer)` wraps a layer: its output becomes `layer(x) + x @ A @ B` with "
        "small `A` (d x r) and `B` (r x d, zeros at first, so the model starts out unchanged). Which layers get "
        "adapters is the choice the Gemma report calls LoRA module naming: here the attention (`qkv`, `proj`) "
        "and MLP (`up`, `down`) matrices. Adapter weights are `nnx.LoRAParam`s; the optimizer is told to touch "
        "only those (`wrt=nnx.LoRAParam`), and gradients are taken only for them (`nnx.DiffState`)."),
    new_code_cell(
        "%%on_tpu\nRANK, TARGETS = 4, (\"qkv\", \"proj\", \"up\", \"down\")\n"
        "rngs = nnx.Rngs(1)\n"
        "for name in TARGETS:\n"
        "    layer = getattr(model.block, name)\n"
        "    d_in, d_out = layer.kernel.shape\n"
        "    setattr(model.block, name, nnx.LoRA(d_in, RANK, d_out, base_module=layer, rngs=rngs))\n"
        "replicate(model)\n\n"
        "BASE = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))           # every weight but the adapters\n"
        "def count(what):\n"
        "    return sum(a.size for a in jax.tree.leaves(nnx.state(model, what)))\n"
        'print(f"LoRA trains {count(nnx.LoRAParam):,} of {count(nnx.Param):,} parameters; "\n'
        '      f"{count(BASE):,} stay frozen")\n'
        "frozen = jax.tree.map(np.asarray, nnx.state(model, BASE))     # to check they never change\n\n"
        "opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.LoRAParam)\n"
        "replicate(opt)\n\n"
        "@nnx.jit\n"
        "def finetune_step(model, opt, x, y):\n"
        "    loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.LoRAParam))(model, x, y)\n"
        "    opt.update(model, grads)\n"
        "    return loss"),
    new_markdown_cell("Fine-tune on the text in capitals; `%tpu_metrics` shows each host's loss while it runs."),
    new_code_cell("# NBVAL_IGNORE_OUTPUT\n%tpu_metrics loss cpu_percent"),  # a widget: its view is not compared
    new_code_cell(
        "%%on_tpu\nimport tpunb\n\nhistory = []\n"
        "for step in range(20):\n"
        "    loss = float(finetune_step(model, opt, *batch(capitals, step)))\n"
        "    history.append(loss)\n"
        "    tpunb.log(step, loss=loss)\n"
        'print(f"fine-tuning loss {history[0]:.2f} -> {history[-1]:.2f}")'),
    new_markdown_cell("Only the adapters moved; the loss on the new task fell:"),
    new_code_cell(
        "%%on_tpu\nafter = jax.tree.map(np.asarray, nnx.state(model, BASE))\n"
        "assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(after)))\n"
        "assert np.mean(history[-5:]) < history[0] - 0.3, history\n"
        'print("base weights unchanged; loss fell")'),
    new_markdown_cell(
        "## Merge the adapters into the weights\n\n"
        "For serving, each adapter folds into its layer: `W + A @ B` is one matrix again, so the merged model "
        "has the base model's shape and speed (the Gemma report converts the merged weights to safetensors for "
        "vLLM at this point). Merging must not change what the model computes:"),
    new_code_cell(
        "%%on_tpu\nforward = nnx.jit(lambda model, x: model(x))\n"
        "x, _ = batch(capitals, 1000)\n"
        "with_adapters = forward(model, x)\n\n"
        "for name in TARGETS:\n"
        "    lora = getattr(model.block, name)\n"
        "    layer = lora.base_module\n"
        "    layer.kernel[...] = layer.kernel[...] + lora.lora_a[...] @ lora.lora_b[...]\n"
        "    setattr(model.block, name, layer)\n\n"
        "merged = forward(model, x)\n"
        "assert not jax.tree.leaves(nnx.state(model, nnx.LoRAParam))   # no adapters left\n"
        "for a, b in zip(with_adapters.addressable_shards, merged.addressable_shards):   # this host's rows\n"
        "    np.testing.assert_allclose(np.asarray(a.data), np.asarray(b.data), rtol=1e-4, atol=1e-4)\n"
        'print(f"merged: {count(nnx.Param):,} parameters, same outputs as base + adapters")'),
    new_markdown_cell(
        "## The same job at full size\n\n"
        "The report fine-tunes Gemma 4 31B with LoRA on a v5p-8. The planner has no Gemma 4 preset, so give it "
        "the parameter count (it estimates the shape; a `config.json` path gives exact numbers), adapters on "
        "every attention and MLP matrix, and a modest fine-tuning run of 100M tokens:"),
    new_code_cell("%tpu_plan 31B --lora 16 --lora-targets q,k,v,o,gate,up,down --batch 64K --seq 4096 "
                  "--tokens 100M --tpu v5p-8"),
    new_markdown_cell(
        "The frozen bf16 weights (58 GiB) fit in each chip's 95 GiB next to the activations, so plain data "
        "parallelism over the v5p-8's 4 chips does (on smaller chips the planner would add an `fsdp` axis, as "
        "in `04_train_flax.ipynb`); the adapters and their optimizer state take about 1 GiB. The run is "
        "compute-bound: about 5 hours and $90 on demand. `03_planning.ipynb` shows the planner in full."),
    new_code_cell("%tpu_down"),
]

write("05_lora_finetune.ipynb", cells)
