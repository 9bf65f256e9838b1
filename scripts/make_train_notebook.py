"""Writes notebooks/04_train_flax.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_train_notebook.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import BLOCK, IGNORE, write

cells = [
    new_markdown_cell(
        "# Train a transformer across hosts with Flax NNX\n\n"
        "A small character-level transformer language model, trained on a **v4-16: 2 hosts x 4 chips**. "
        "Every host reads its own half of the data, one mesh spans all 8 chips of both hosts, and the same "
        "model is trained first data parallel, then fully sharded (FSDP). On the way: the loss of every host "
        "live in `%tpu_metrics`, a profile of a few steps, a checkpoint that every host writes and restores, "
        "and the loss curve pulled back into the notebook.\n\n"
        "Here the slice is **simulated** (one process per host on this machine, its chips as JAX CPU devices), "
        "so it runs anywhere in about a minute. **On a real slice**, configure a Google Cloud project "
        "(`gcloud auth application-default login`; in Colab `tpunb.colab.authenticate(\"my-project\")`) and "
        "launch with `%tpu_launch v4-16 --zone us-central2-b`; every other cell runs unchanged "
        "(make the model and batch bigger: this one is sized for a laptop)."),
    new_code_cell("%load_ext tpunb\n%tpu_launch v4-16 --name flax"),
    new_markdown_cell(
        "## Data on every host\n\n"
        "tpunb ships the first 40,000 characters of Shakespeare's *Coriolanus* (public domain). The notebook "
        "reads it and `%tpu_push` sends it to every host; each host then keeps only its own half, as it would "
        "read its own shard of a real dataset."),
    new_code_cell('from importlib.resources import files\n\n'
                  'text = (files("tpunb") / "data" / "coriolanus.txt").read_text()\n'
                  'print(f"{len(text):,} characters; it begins {text[:31]!r}")\n'
                  "%tpu_push text"),
    new_code_cell(
        "%%on_tpu\nimport functools, time\n\nimport jax, jax.numpy as jnp, numpy as np, optax, tpunb\nfrom flax import nnx\n"
        "from jax.sharding import AxisType, NamedSharding, PartitionSpec as P\n\n"
        "chars = sorted(set(text))\n"
        "tokens = np.array([chars.index(c) for c in text], dtype=np.int32)\n"
        "host, hosts = jax.process_index(), jax.process_count()\n"
        "mine = np.array_split(tokens, hosts)[host]        # this host's half of the text\n"
        'print(f"host {host}: characters {host * len(mine):,} to {(host + 1) * len(mine):,}; "\n'
        '      f"vocabulary {len(chars)}; {jax.local_device_count()} of {jax.device_count()} devices")'),
    new_markdown_cell(
        "## The model\n\n"
        "Two pre-norm transformer blocks (causal self-attention and an MLP), 64-wide, over 64 characters, with "
        "the input embedding reused as the output layer. Every host builds it from the same seed, so they "
        "start from the same weights."),
    new_code_cell(
        "%%on_tpu\nSEQ, BATCH = 64, 32                                # BATCH sequences per step, over all hosts\n\n"
        + BLOCK +
        "class CharLM(nnx.Module):\n"
        "    def __init__(self, vocab, d=64, heads=4, layers=2, *, rngs):\n"
        "        self.embed = nnx.Embed(vocab, d, rngs=rngs)\n"
        "        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (SEQ, d)))\n"
        "        self.blocks = nnx.Sequential(*[Block(d, heads, rngs) for _ in range(layers)])\n"
        "        self.norm = nnx.RMSNorm(d, rngs=rngs)\n\n"
        "    def __call__(self, ids):\n"
        "        x = self.blocks(self.embed(ids) + self.pos[: ids.shape[1]])\n"
        "        return self.embed.attend(self.norm(x))          # logits over the vocabulary\n\n"
        "def loss_fn(model, x, y):\n"
        "    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()\n\n"
        "@nnx.jit\n"
        "def train_step(model, opt, x, y):\n"
        "    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)\n"
        "    opt.update(model, grads)\n"
        "    return loss\n\n"
        "def local_batch(step):\n"
        '    """This host\'s BATCH // hosts windows of its own text, inputs and next-character targets."""\n'
        "    starts = np.random.default_rng([step, host]).integers(0, len(mine) - SEQ - 1, BATCH // hosts)\n"
        "    windows = np.stack([mine[s : s + SEQ + 1] for s in starts])\n"
        "    return windows[:, :-1], windows[:, 1:]\n\n"
        "@functools.partial(nnx.jit, static_argnums=0)      # one compiled program builds it all\n"
        "def create(seed):\n"
        "    model = CharLM(len(chars), rngs=nnx.Rngs(seed))\n"
        "    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)\n\n"
        "model, opt = create(0)\n"
        'print(f"{sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param))):,} parameters")'),
    new_markdown_cell(
        "## Data parallel\n\n"
        "`jax.make_mesh` lays the 8 devices of both hosts out as one axis, `data`. A `NamedSharding` says how "
        "an array lies on the mesh: the weights are replicated (`P()`: every device holds all of them), the "
        "batch is split along `data`, so each device gets 4 of the 32 sequences. Each host contributes the "
        "rows of its own devices with `jax.make_array_from_process_local_data`; the gradient is averaged over "
        "all 8 devices inside the jitted step (an all-reduce across hosts) without a line of code for it."),
    new_code_cell(
        "%%on_tpu\n"
        'mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))\n'
        'batch_sharding = NamedSharding(mesh, P("data"))\n\n'
        "def place(tree, spec_of):\n"
        '    """Lay every array of a model or optimizer state out on the mesh, as spec_of(array) says."""\n'
        "    return jax.device_put(tree, jax.tree.map(lambda a: NamedSharding(mesh, spec_of(a)), tree))\n\n"
        "def global_batch(step):\n"
        "    return [jax.make_array_from_process_local_data(batch_sharding, part) for part in local_batch(step)]\n\n"
        "state = nnx.state((model, opt))\n"
        "nnx.update((model, opt), place(state, lambda a: P()))     # replicated on all 8 devices\n"
        "x, y = global_batch(0)\n"
        'print(mesh)\nprint(f"global batch {x.shape}, split {x.sharding.spec}: host {host} holds rows",\n'
        "      sorted(s.index[0].start for s in x.addressable_shards), \"(4 each)\")"),
    new_markdown_cell(
        "Open the live metrics, then train. Each host calls `tpunb.log(step, loss=...)`, which costs "
        "microseconds; `%tpu_metrics` redraws the loss of every host while the cell runs, next to CPU and "
        "memory, and would call out a host that falls behind."),
    new_code_cell("# NBVAL_IGNORE_OUTPUT\n%tpu_metrics loss cpu_percent rss_bytes"),  # a widget: its view is not compared
    new_code_cell(
        "%%on_tpu\nhistory = []                                        # (step, loss) on this host\n\n"
        "def train(steps):\n"
        "    started = time.perf_counter()\n"
        "    for step in steps:\n"
        "        loss = float(train_step(model, opt, *global_batch(step)))\n"
        "        history.append((step, loss))\n"
        "        tpunb.log(step, loss=loss)                     # to %tpu_metrics\n"
        "        if step % 8 == 0 or step == steps[-1]:\n"
        '            print(f"step {step:3d}  loss {loss:.3f}")\n'
        '    print(f"{len(steps)} steps in {time.perf_counter() - started:.0f} s, compiling included")\n\n'
        "train(range(20))"),
    new_markdown_cell(
        "## Fully sharded (FSDP)\n\n"
        "Replicated weights cost every device the whole model and its optimizer state. FSDP splits them "
        "instead: each weight matrix is cut into pieces, one per device, and the jitted step gathers a weight "
        "just before it is used and scatters its gradient back. A second mesh axis says where: `fsdp` runs over "
        "the 4 chips of a host, `data` over the 2 hosts. Weights are sharded inside a host (where chips talk "
        "over the fast interconnect) and replicated across hosts, while the batch is split over all 8 devices. "
        "Nothing else changes: the same `train_step` continues training the same model, and XLA inserts the "
        "all-gathers and reduce-scatters. (Sharding over all 8 devices works too, with a 1-D `fsdp` mesh; "
        "here it would send every weight between the simulated hosts over TCP in every step.)"),
    new_code_cell(
        "%%on_tpu\n"
        'mesh = jax.make_mesh((hosts, jax.local_device_count()), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)\n'
        'batch_sharding = NamedSharding(mesh, P(("data", "fsdp")))\n\n'
        "def fsdp(a):\n"
        '    """Split a matrix\'s rows over the fsdp axis; vectors, scalars and the 58-row embedding stay whole."""\n'
        '    return P("fsdp") if a.ndim >= 2 and a.shape[0] % mesh.shape["fsdp"] == 0 else P()\n\n'
        "nnx.update((model, opt), place(nnx.state((model, opt)), fsdp))\n"
        "up = model.blocks.layers[0].up.kernel\n"
        'print(mesh)\nprint(f"up.kernel {up.shape} is {up.sharding.spec}: each device holds {up.addressable_shards[0].data.shape}")\n'
        "arrays = jax.tree.leaves(nnx.state((model, opt)))\n"
        "per_device = sum(a.addressable_shards[0].data.nbytes for a in arrays)\n"
        'print(f"model and Adam state per device: {per_device / 1024:.0f} KiB "\n'
        '      f"(replicated: {sum(a.nbytes for a in arrays) / 1024:.0f} KiB)")'),
    new_code_cell("%%on_tpu\ntrain(range(20, 35))                                # the same loop, now on the FSDP mesh"),
    new_markdown_cell(
        "## Profile a few steps\n\n"
        "`%%tpu_profile` runs the cell with `jax.profiler` recording on every host and shows one timeline per "
        "host on one time axis, the ops that took the time, and the straggler: the host the others waited for "
        "(see `06_profiling.ipynb`). Zoom with the mouse wheel, drag to pan."),
    new_code_cell(
        "%%tpu_profile --name fsdp-steps\nfor step in range(35, 39):\n"
        "    loss = float(train_step(model, opt, *global_batch(step)))\n"
        "    history.append((step, loss))", metadata=IGNORE),  # the profile view: this run's timings
    new_code_cell("import tpunb\n\nprof = tpunb.last_profile()\n"
                  "steps = prof.events.query(\"name == 'PjitFunction(train_step)'\")\n"
                  "print(\"train_step calls per host:\", steps.groupby(\"host\").size().to_dict())"),
    new_markdown_cell(
        "## Checkpoint on every host, then restore\n\n"
        "No device holds the whole model any more, so every host saves the pieces its own devices hold "
        "(`addressable_shards`: its 4 devices' slices of each array) to its own disk, and restores them into "
        "the same shardings with `jax.make_array_from_callback`, which asks each host only for its own "
        "pieces. (With this mesh the two hosts hold the same pieces, as the weights are replicated across "
        "hosts; with FSDP over all 8 devices each would hold half.) For real runs, Orbax (`orbax.checkpoint`) does the same to a shared bucket, asynchronously."),
    new_code_cell(
        "import tempfile\n\n# here a fresh folder; on a real slice, a folder on every host's own disk\n"
        "checkpoint_dir = tempfile.mkdtemp(prefix=\"tpunb-checkpoint-\")\n%tpu_push checkpoint_dir"),
    new_code_cell(
        "%%on_tpu\nimport os, pickle\n\n"
        "def key(index):\n    return tuple((s.start, s.stop) for s in index)\n\n"
        "def save(tree, path):\n"
        "    leaves = jax.tree.leaves(tree)\n"
        "    pieces = [{key(s.index): np.asarray(s.data) for s in a.addressable_shards} for a in leaves]\n"
        "    with open(path, \"wb\") as f:\n        pickle.dump(pieces, f)\n"
        "    return sum(p.nbytes for leaf in pieces for p in leaf.values())\n\n"
        "def restore(like, path):\n"
        '    """Arrays shaped and sharded like `like`, filled from this host\'s own pieces."""\n'
        "    with open(path, \"rb\") as f:\n        pieces = pickle.load(f)\n"
        "    leaves, treedef = jax.tree.flatten(like)\n"
        "    return jax.tree.unflatten(treedef, [\n"
        "        jax.make_array_from_callback(a.shape, a.sharding, lambda index, p=p: p[key(index)])\n"
        "        for a, p in zip(leaves, pieces)])\n\n"
        "os.makedirs(checkpoint_dir, exist_ok=True)\n"
        'path = os.path.join(checkpoint_dir, f"host-{host}.pkl")\n'
        "saved = nnx.state((model, opt))\n"
        "size = save(saved, path)\n"
        "shards = sum(len(a.addressable_shards) for a in jax.tree.leaves(saved))\n"
        'print(f"host {host} saved {shards} shards of {len(jax.tree.leaves(saved))} arrays: {size / 1024:.0f} KiB")'),
    new_markdown_cell("Restore into a fresh, untrained model and optimizer laid out the same way, and check that "
                      "every restored array equals the trained one:"),
    new_code_cell(
        "%%on_tpu\nfresh_model, fresh_opt = create(0)\n"
        "nnx.update((fresh_model, fresh_opt), restore(nnx.state((model, opt)), path))\n\n"
        "def equal(a, b):\n"
        "    return all(np.array_equal(s.data, t.data) for s, t in zip(a.addressable_shards, b.addressable_shards))\n\n"
        "same = jax.tree.map(equal, nnx.state((model, opt)), nnx.state((fresh_model, fresh_opt)))\n"
        "assert all(jax.tree.leaves(same))\n"
        'print(f"host {host}: all {len(jax.tree.leaves(same))} arrays restored equal, with their shardings")'),
    new_markdown_cell(
        "## The loss curve\n\n"
        "`%tpu_pull` fetches a variable from every host as `{host: value}`. Both hosts computed the same "
        "global loss (the batch spans both), so their curves lie on top of each other."),
    new_code_cell(
        "histories = %tpu_pull history\n"
        "import matplotlib.pyplot as plt\n\n"
        "fig, ax = plt.subplots(figsize=(6, 3))\n"
        "for h, points in histories.items():\n"
        "    steps, losses = zip(*points)\n"
        '    ax.plot(steps, losses, label=f"host {h}", linestyle="-" if h == 0 else "--")\n'
        'ax.axvline(20, color="grey", linewidth=0.8)\nax.text(21, max(losses) * 0.95, "FSDP from here", color="grey")\n'
        'ax.set(xlabel="step", ylabel="loss (nats per character)", title="Char-level LM on a simulated v4-16")\n'
        "ax.legend()\nplt.show()"),
    new_markdown_cell("The loss must fall (this cell fails the notebook, and so the tests, if training breaks):"),
    new_code_cell(
        "first, last = histories[0][0][1], sum(loss for _, loss in histories[0][-5:]) / 5\n"
        "assert last < first - 1.0, f\"loss did not fall: {first:.2f} -> {last:.2f}\"\n"
        "assert histories[0] == histories[1]          # one global loss, the same on both hosts"),
    new_code_cell("%tpu_down"),
]

write("04_train_flax.ipynb", cells)
