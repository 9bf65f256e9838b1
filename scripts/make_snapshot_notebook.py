"""Writes notebooks/09_snapshot.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_snapshot_notebook.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import BLOCK, IGNORE, write

MODEL = (
    "%%on_tpu\nimport jax, jax.numpy as jnp, numpy as np, optax, tpunb\nfrom flax import nnx\n"
    "from jax.sharding import AxisType, NamedSharding, PartitionSpec as P\n\n"
    "chars = sorted(set(text))\n"
    "tokens = np.array([chars.index(c) for c in text], dtype=np.int32)\n"
    "host, hosts = jax.process_index(), jax.process_count()\n"
    "mine = np.array_split(tokens, hosts)[host]          # this host's share of the text\n"
    "SEQ, BATCH = 64, 32\n\n"
    + BLOCK +
    "class CharLM(nnx.Module):\n"
    "    def __init__(self, vocab, d=64, heads=4, layers=2, *, rngs):\n"
    "        self.embed = nnx.Embed(vocab, d, rngs=rngs)\n"
    "        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (SEQ, d)))\n"
    "        self.blocks = nnx.Sequential(*[Block(d, heads, rngs) for _ in range(layers)])\n"
    "        self.norm = nnx.RMSNorm(d, rngs=rngs)\n\n"
    "    def __call__(self, ids):\n"
    "        return self.embed.attend(self.norm(self.blocks(self.embed(ids) + self.pos[: ids.shape[1]])))\n\n"
    "@nnx.jit\n"
    "def train_step(model, opt, x, y):\n"
    "    loss_fn = lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()\n"
    "    loss, grads = nnx.value_and_grad(loss_fn)(model)\n"
    "    opt.update(model, grads)\n"
    "    return loss\n\n"
    'mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))\n\n'
    "def global_batch(step):\n"
    "    starts = np.random.default_rng([step, host]).integers(0, len(mine) - SEQ - 1, BATCH // hosts)\n"
    "    windows = np.stack([mine[s : s + SEQ + 1] for s in starts])\n"
    '    sharding = NamedSharding(mesh, P("data"))\n'
    "    return [jax.make_array_from_process_local_data(sharding, part) for part in (windows[:, :-1], windows[:, 1:])]\n\n"
    "def train(steps):\n"
    "    global step\n"
    "    for step in steps:\n"
    "        loss = float(train_step(model, opt, *global_batch(step)))\n"
    "        history.append((step, loss))\n"
    "        tpunb.log(step, loss=loss)                   # a step boundary: where a preemption snapshot can happen\n"
    "        if step % 10 == 0 or step == steps[-1]:\n"
    '            print(f"step {step:3d}  loss {loss:.2f}")\n\n'
    "def fresh():\n"
    '    """A model and its Adam state, replicated on every device of this slice\'s mesh."""\n'
    "    model = CharLM(len(chars), rngs=nnx.Rngs(0))\n"
    "    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)\n"
    "    state = nnx.state((model, opt))\n"
    "    nnx.update((model, opt), jax.device_put(state, NamedSharding(mesh, P())))\n"
    "    return model, opt\n\n"
    'print(f"host {host}: {jax.local_device_count()} of {jax.device_count()} devices, mesh {dict(mesh.shape)}")')

cells = [
    new_markdown_cell(
        "# State that survives the slice: snapshot, move, continue\n\n"
        "A notebook's value is its state: the model in HBM, the optimizer, the step counter. On a TPU slice it "
        "dies with the slice: spot capacity reclaimed, a maintenance event, `%tpu_down` for the night, a move "
        "to a bigger or smaller slice. `%tpu_snapshot` saves named host variables from every host, and "
        "`%tpu_restore` puts them back on whatever slice comes next, **re-sharded for its shape**.\n\n"
        "Here a small character-level transformer trains on a **v4-16** (2 hosts x 4 chips); half-way, its "
        "state is snapshotted, the slice is deleted, a **v4-8** (1 host, 4 chips) takes its place, the state "
        "comes back sharded over the 4 new devices, and training continues: the loss curve carries on where "
        "it stopped.\n\n"
        "The slices are **simulated** (one process per host on this machine, its chips as JAX CPU devices). "
        "**On Cloud TPU**, snapshots go to Cloud Storage: name a bucket once (`%tpu_snapshot --bucket B`, or "
        "`TPUNB_BUCKET`), or give `--to gs://BUCKET/PATH`; every cell below runs unchanged."),
    new_code_cell("%load_ext tpunb\n%tpu_launch v4-16 --name before"),
    new_code_cell('from importlib.resources import files\n\n'
                  'text = (files("tpunb") / "data" / "coriolanus.txt").read_text()\n%tpu_push text'),
    new_markdown_cell(
        "## Train on the v4-16\n\n"
        "The same model as `04_train_flax.ipynb`, data parallel over one mesh axis, `data`, that spans the 8 "
        "devices of both hosts; each host reads its own half of the text. The model code lives in one cell, "
        "so the next slice can run it again."),
    new_code_cell(MODEL),
    new_code_cell("%%on_tpu\nmodel, opt = fresh()\nhistory, step = [], 0\ntrain(range(0, 30))"),
    new_markdown_cell(
        "## Snapshot mid-way\n\n"
        "`state` is an `nnx.State`, a pytree of global `jax.Array`s: orbax-checkpoint writes it, each host "
        "its own shards, with each array's sharding (here a 1-D mesh, `data`). `history` (a list) and `step` "
        "(an int) are pickled per host. The manifest is written last, so a snapshot cut short by Ctrl-C or a "
        "dying VM never looks complete."),
    new_code_cell("%%on_tpu\nstate = nnx.state((model, opt))"),
    new_code_cell('import tempfile\n\nsnapshots = tempfile.mkdtemp(prefix="tpunb-snapshot-")\n'
                  "%tpu_snapshot state history step --to {snapshots}/run"),
    new_code_cell("%tpu_snapshot --list", metadata=IGNORE),  # times and folders of this run
    new_markdown_cell(
        "## Move to a v4-8\n\n"
        "Delete the v4-16 (its hosts and everything in them are gone) and launch a slice of another shape."),
    new_code_cell("%tpu_down before\n%tpu_launch v4-8 --name after\n%tpu_push text"),
    new_code_cell(MODEL),
    new_markdown_cell(
        "`%tpu_restore` checks everything before it loads anything: every array keeps its `PartitionSpec` on a "
        "mesh with the same axis names, sized to the 4 new devices, and must still divide evenly and fit in "
        "HBM; a per-host value comes back to the host of the same index, or, as here with one host instead "
        "of two, everywhere when it was the same on every host."),
    new_code_cell("%tpu_restore {snapshots}/run"),
    new_code_cell(
        "%%on_tpu\nmodel, opt = fresh()\nnnx.update((model, opt), state)                    # the trained weights and Adam's moments\n"
        "w = model.blocks.layers[0].up.kernel\n"
        'print(f"up.kernel {w.shape} on {len(w.sharding.device_set)} devices ({w.sharding.spec}); step {step}")\n'
        "train(range(step + 1, step + 31))"),
    new_markdown_cell("## The loss curve, unbroken\n\n"
                      "`history` came back with the state and grew on the v4-8. Pull it and plot it:"),
    new_code_cell(
        "history = %tpu_pull history --host 0\n"
        "import matplotlib.pyplot as plt\n\n"
        "steps, losses = zip(*history)\n"
        "fig, ax = plt.subplots(figsize=(6, 3))\n"
        'ax.plot(steps, losses)\nax.axvline(29.5, color="grey", linewidth=0.8)\n'
        'ax.text(31, max(losses) * 0.95, "restored on a v4-8", color="grey")\n'
        'ax.set(xlabel="step", ylabel="loss (nats per character)", title="Trained on a v4-16, then a v4-8")\n'
        "plt.show()"),
    new_markdown_cell("No jump where the slice changed (this cell fails the notebook, and the tests, if it did):"),
    new_code_cell(
        "before, after = losses[29], losses[30]\n"
        "assert steps == tuple(range(60)), steps\n"
        'assert after < before + 0.3, f"the loss jumped at the move: {before:.2f} -> {after:.2f}"\n'
        'assert losses[-1] < losses[0] - 1.0, "the loss did not fall"\n'
        'print(f"step 29 on the v4-16: {before:.2f}; step 30 on the v4-8: {after:.2f}; step 59: {losses[-1]:.2f}")'),
    new_markdown_cell(
        "## When the slice is taken from you\n\n"
        "A spot slice can be reclaimed at any time; Compute Engine gives its VMs a notice about 30 s before "
        "they go (the metadata server's `instance/preempted` turns `TRUE`, and the guest's shutdown sends "
        "`SIGTERM`). Armed hosts save the named variables by themselves, kernel or no kernel: at once when no "
        "cell runs, else at the next `tpunb.log` step of the running cell, at the same step on every host "
        "(JAX's preemption sync). `--recover` then brings the slice back with the last complete snapshot:\n\n"
        "```\n"
        "%tpu_launch v5litepod-16 --spot --name run --snapshot-on-preempt state,history,step\n"
        "...                                 # train; the slice is preempted\n"
        "%tpu_launch --recover run\n"
        "```\n\n"
        "`%tpu_snapshot --on-preempt NAMES` arms a running slice. `02_cloud_workflow.ipynb`'s sandbox "
        "(`start_sandbox(storage=True)`) models the notice, with Cloud Storage on this machine."),
    new_code_cell("%tpu_down after"),
]

write("09_snapshot.ipynb", cells)
