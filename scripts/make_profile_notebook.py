"""Writes notebooks/06_profiling.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_profile_notebook.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import IGNORE, write

cells = [
    new_markdown_cell(
        "# Profiling a few training steps on every host\n\n"
        "`%%tpu_profile` runs a cell exactly as `%%on_tpu` does, with `jax.profiler` recording on every host. "
        "Each host summarises its own trace and sends it back with the files, so the notebook shows one timeline "
        "per host on one time axis, the ops that took the time, and which host the others waited for.\n\n"
        "Here the slice is simulated on this machine. **On a real slice**, configure a Google Cloud project and "
        "launch with `%tpu_launch v4-16 --zone us-central2-b`: the rest runs unchanged, and the timeline then "
        "shows the TPU's own ops."),
    new_code_cell("%load_ext tpunb\n%tpu_launch v4-16 --name profiling"),
    new_markdown_cell("A data-parallel step: each host holds half of the batch, and the gradient is reduced "
                      "across both hosts (an all-reduce) in every step. Host 1 does extra work between steps "
                      "(the `sleep`), as a slow input pipeline would:"),
    new_code_cell(
        "%%on_tpu\nimport jax, jax.numpy as jnp, numpy as np, time\n"
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n\n"
        "mesh = Mesh(np.array(jax.devices()), ('data',))\n"
        "w = jax.device_put(jnp.ones((128, 128)) * 0.01, NamedSharding(mesh, P()))\n"
        "local = np.random.default_rng(jax.process_index()).normal(size=(128, 128)).astype('float32')\n"
        "xs = jax.make_array_from_process_local_data(NamedSharding(mesh, P('data')), local)\n\n"
        "@jax.jit\ndef train_step(w, x):\n"
        "    loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)\n"
        "    return w - 0.1 * grad, loss\n\n"
        "w, loss = train_step(w, xs)   # compile before profiling\n"
        "print('first loss', round(float(loss), 4))"),
    new_markdown_cell("Profile ten steps. Zoom the timeline with the mouse wheel, drag to pan, double-click to "
                      "reset; hover a bar for its name and duration."),
    new_code_cell(
        "%%tpu_profile --name ten-steps\n"
        "for step in range(10):\n"
        "    if jax.process_index() == 1:\n"
        "        time.sleep(0.02)      # host 1's extra work\n"
        "    w, loss = train_step(w, xs)\n"
        "    loss.block_until_ready()", metadata=IGNORE),  # the view's timeline holds this run's timings
    new_code_cell("%%on_tpu\nprint('loss after ten steps', round(float(loss), 4))"),
    new_markdown_cell("The same profile in Python: the straggler, every event as a DataFrame, the top ops per "
                      "host, and the step times. `prof.path` holds the files, one folder per host, for "
                      "`xprof --logdir` or TensorBoard."),
    new_code_cell("import tpunb\nprof = tpunb.last_profile()\nprint('straggler: host', prof.straggler)\n"
                  "print('train_step calls per host:', prof.events.query(\"name == 'PjitFunction(train_step)'\")"
                  ".groupby('host').size().to_dict())"),
    new_code_cell("prof.top(5)", metadata=IGNORE),  # milliseconds of this run (and their order)
    new_code_cell("prof.steps.describe().loc[['count', '50%']]", metadata=IGNORE),  # the median: this run's
    new_markdown_cell("`%tpu_profile start` and `%tpu_profile stop` record around any number of `%%on_tpu` "
                      "cells; `%tpu_profile` alone says whether a recording runs and lists past profiles."),
    new_code_cell("%tpu_profile start"),
    new_code_cell("%%on_tpu\nfor step in range(3):\n    w, loss = train_step(w, xs)\nprint('loss', round(float(loss), 4))"),
    new_code_cell("%tpu_profile stop", metadata=IGNORE),  # the view again: this run's timings
    new_code_cell("%tpu_down"),
]

write("06_profiling.ipynb", cells)
