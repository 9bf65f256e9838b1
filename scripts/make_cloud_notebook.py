"""Writes notebooks/02_cloud_workflow.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_cloud_notebook.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import write

cells = [
    new_markdown_cell(
        "# The Cloud TPU workflow: launch, run, preemption, recover, down\n\n"
        "`%tpu_launch` creates a TPU slice with the official google-cloud-tpu client, waits for it while "
        "showing its states and cost, and connects to every worker over SSH. This notebook rehearses the "
        "whole workflow against **tpunb's Cloud TPU API emulator**, whose nodes' hosts are real SSH hosts on "
        "this machine, so it runs anywhere for free.\n\n"
        "**On a real project, skip the sandbox cell** and configure a project instead: "
        "`gcloud auth application-default login`, then `GOOGLE_CLOUD_PROJECT` and `CLOUDSDK_COMPUTE_ZONE` "
        "(or `--project` / `--zone`, or gcloud's own configuration); in Colab, "
        "`tpunb.colab.authenticate(\"my-project\")`. Then `%tpu_launch v4-16 --spot --zone us-central2-b` "
        "creates a real slice, and every other cell runs as below."),
    new_code_cell("%load_ext tpunb"),
    new_code_cell("from tpunb.emulator.sandbox import start_sandbox\n\n"
                  "sandbox = start_sandbox()   # emulator + sshd hosts; sets TPUNB_TPU_API_ENDPOINT, project, zone\n"
                  "sandbox"),
    new_markdown_cell("With a project configured, `%tpu_launch` uses Cloud TPU (`--backend gcp`). A spot `v4-16` "
                      "is 8 chips on 2 hosts. The progress shows each state, the time it took and the price."),
    new_code_cell("# NBVAL_IGNORE_OUTPUT\n%tpu_launch v4-16 --spot --name spotty"),
    new_markdown_cell("Google's TPU VM images come with Python 3.10 and no JAX (\"choose the image, then install "
                      "the framework\"), and the sandbox's hosts are such images. So the launch prepared every host "
                      "before its first cell, all at once under one progress bar: a "
                      "[uv](https://docs.astral.sh/uv/) environment with this notebook's Python, jax at this "
                      "notebook's version, flax and what tpunb's hosts need (`--pip`, `--requirements`, `--python`, "
                      "`--jax` change that). A reconnect only checks it. `%tpu_status --versions` lists what each "
                      "host runs:"),
    new_code_cell("import platform\nfrom importlib.metadata import version\n\n"
                  "versions = %tpu_status --versions\n"
                  "print('every host on this notebook\\'s Python:', all(versions['python'] == platform.python_version()))\n"
                  "print('every host on this notebook\\'s jax:', all(versions['jax'] == version('jax')))"),
    new_markdown_cell("The hosts are reached over SSH with tpunb's own key (injected through the node's "
                      "`ssh-keys` metadata), and `jax.distributed` spans both, its process ids and coordinator "
                      "read from each VM's metadata server as on any TPU VM:"),
    new_code_cell("%%on_tpu\nimport jax\nprint('devices:', jax.device_count(), '| this host:', jax.local_device_count())\n"
                  "jax.process_index()"),
    new_markdown_cell("`%tpu_status` shows the cloud's view: state, health, uptime and the hourly price."),
    new_code_cell("status = %tpu_status\nstatus[['slice', 'accelerator', 'backend', 'cloud_state', 'usd_per_hour', 'host']]"),
    new_markdown_cell("Spot capacity can be reclaimed at any time. The sandbox can do that on demand; tpunb "
                      "notices it in the background, in `%tpu_status`, and before the next cell:"),
    new_code_cell("sandbox.preempt('spotty')\nstatus = %tpu_status\nstatus[['slice', 'cloud_state']]"),
    new_code_cell("%%on_tpu\nprint('this will not run')", metadata={"tags": ["raises-exception"]}),
    new_markdown_cell("`--recover` deletes the lost node and launches the same spec again (state on the hosts "
                      "is lost, as it is with any preemption: checkpoint what matters)."),
    new_code_cell("# NBVAL_IGNORE_OUTPUT\n%tpu_launch --recover spotty"),
    new_code_cell("%%on_tpu\nimport jax\njax.device_count()"),
    new_markdown_cell("`%tpu_down` deletes the node and waits until it is gone; nothing keeps billing."),
    new_code_cell("%tpu_down spotty"),
    new_code_cell("status = %tpu_status\nlen(status)"),
    new_code_cell("sandbox.stop()"),
]
write("02_cloud_workflow.ipynb", cells)
