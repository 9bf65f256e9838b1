"""Writes notebooks/01_quickstart.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_quickstart.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import write

cells = [
    new_markdown_cell(
        "# tpunb quickstart: a multi-host TPU slice, simulated on this machine\n\n"
        "With no Google Cloud project configured, `%tpu_launch` starts a **local simulated slice**: one Python "
        "process per TPU host, each seeing its share of chips as JAX CPU devices, joined by `jax.distributed`. "
        "Everything below runs unchanged on a real slice: configure a Google Cloud project "
        "(`gcloud auth application-default login`; in Colab `tpunb.colab.authenticate(\"my-project\")`) and launch "
        "with `%tpu_launch v4-16 --zone us-central2-b` instead (`02_cloud_workflow.ipynb` walks through it)."),
    new_code_cell("%load_ext tpunb"),
    new_markdown_cell("A `v4-16` has 8 chips on 2 hosts (4 per host). Launching starts both hosts:"),
    new_code_cell("%tpu_launch v4-16"),
    new_markdown_cell(
        "`%%on_tpu` runs the cell on every host at once. Output that is the same on every host is shown once, "
        "labelled with the hosts (`[0-1]`); values that differ are shown per host. No `jax.distributed` set-up "
        "code: the first cell already sees the whole slice."),
    new_code_cell("%%on_tpu\nimport jax\nprint('global devices:', jax.device_count(), '| local:', jax.local_device_count())\n"
                  "jax.process_index()"),
    new_markdown_cell("Each host keeps its own Python session between cells. Build an array sharded over all 8 "
                      "devices of both hosts, each host contributing its half, and reduce it across hosts:"),
    new_code_cell(
        "%%on_tpu\nimport jax.numpy as jnp, numpy as np\nfrom jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n\n"
        "mesh = Mesh(np.array(jax.devices()), ('data',))\n"
        "local = np.arange(8.0) + 8 * jax.process_index()      # this host's rows\n"
        "x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('data')), local)\n"
        "print('global shape', x.shape, 'addressable shards', len(x.addressable_shards))\n"
        "float(jax.jit(jnp.sum)(x))                            # 0 + 1 + ... + 15 = 120"),
    new_markdown_cell("Send notebook values to every host with `%tpu_push`, and fetch host values with `%tpu_pull`:"),
    new_code_cell("scale = 10\n%tpu_push scale"),
    new_code_cell("%%on_tpu\nscaled = float(jnp.sum(x)) * scale + jax.process_index()"),
    new_code_cell("%tpu_pull scaled"),
    new_markdown_cell(
        "Every host samples its CPU, memory and accelerator memory once a second, and cells can log their own "
        "metrics with `tpunb.log(step, name=value)`. `%tpu_metrics` shows them live, per host, while cells run "
        "(a widget in JupyterLab, Notebook, VS Code and Colab); a host that lags or sits idle is called out. "
        "`Slice.metrics()` returns every sample as a DataFrame."),
    new_code_cell("# NBVAL_IGNORE_OUTPUT\n%tpu_metrics"),
    new_code_cell("%%on_tpu\nimport time, tpunb\nfor step in range(20):\n"
                  "    loss = float(jnp.sum(x)) / (step + 1) / (1 + jax.process_index())\n"
                  "    tpunb.log(step, loss=loss)\n    time.sleep(0.1)"),
    new_markdown_cell("A cell's logged values arrive with the cell: the next cell sees every step of both hosts."),
    new_code_cell("import tpunb\nlosses = tpunb.current().metrics().query(\"metric == 'loss'\")\n"
                  "print(len(losses), 'losses')  # both hosts' 20 steps\n"
                  "losses.pivot(index='step', columns='host', values='value').tail(3)"),
    new_markdown_cell("An error on any host fails the cell (so *Run all* stops) and shows that host's own "
                      "traceback, labelled. The same error from several hosts is shown once."),
    new_code_cell("%%on_tpu\ndef step(batch):\n    return batch / (jax.process_index() - 1)\n\nstep(1.0)",
                  metadata={"tags": ["raises-exception"]}),
    new_markdown_cell(
        "## When a run hangs\n\n"
        "A collective that only some hosts reach waits forever for the others, and from the notebook it just looks "
        "busy. Here host 1 alone takes a checkpoint, whose barrier waits for every host. `--bg` runs the cell in the "
        "background: it returns at once with a handle (`tpunb.last_run()`, also `_`), its output still streams into "
        "its own cell, and the notebook stays free to look."),
    new_code_cell("%%on_tpu --bg\nfrom jax.experimental import multihost_utils\n\ndef save_checkpoint():\n"
                  "    multihost_utils.sync_global_devices('checkpoint')   # waits for every host\n\n"
                  "if jax.process_index() == 1:                            # the bug: only host 1 gets here\n"
                  "    save_checkpoint()"),
    new_markdown_cell("Is it done? Give it 20 seconds:"),
    new_code_cell("run = tpunb.last_run()\nrun.wait(timeout=20)"),
    new_markdown_cell(
        "`%tpu_stacks` shows where every host is: each host dumps every thread's stack from a signal handler, so it "
        "works while the host is blocked in C (inside XLA's collective, where Ctrl-C cannot reach it). Identical "
        "stacks are grouped with their hosts, your frames come first and tpunb's own are hidden. (`python -m tpunb "
        "stacks v4-16` in a terminal, and the *stacks* button on a host in the JupyterLab sidebar, show the same "
        "while the notebook itself is busy.)"),
    new_code_cell("%tpu_stacks"),
    new_markdown_cell(
        "Host 1 will never leave that barrier, and JAX cannot be initialized twice in one process. `%tpu_restart` "
        "starts fresh Python sessions on every host of the same slice: hosts that do not exit are killed, JAX starts "
        "again over the whole slice, the hosts' variables are gone, and the slice, its environment and its services "
        "stay. (A cell run with `--timeout` shows the stuck host's stack the same way before it kills it, and its "
        "error line suggests `%tpu_restart`.)"),
    new_code_cell("%tpu_restart"),
    new_code_cell("%%on_tpu\nimport jax\nprint('x' in globals(), jax.device_count())"),
    new_markdown_cell("`%tpu_status` lists slices and hosts; `%tpu_down` ends the slice (running it twice is fine)."),
    new_code_cell("# NBVAL_IGNORE_OUTPUT\n%tpu_status"),
    new_code_cell("%tpu_down"),
]
write("01_quickstart.ipynb", cells)
