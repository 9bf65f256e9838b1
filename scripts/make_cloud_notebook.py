"""Writes notebooks/02_cloud_workflow.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_cloud_notebook.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import write

cells = [
    new_markdown_cell(
        "# The cloud workflow: launch, run, preemption, recover, down\n\n"
        "`%tpu_launch` makes a TPU slice in Google Cloud, waits for it while showing each step, and connects to "
        "every VM over SSH. TPU7x, v6e and v5p are made through **Compute Engine** (the official "
        "google-cloud-compute client): one VM, or for a multi-host slice a managed instance group (MIG) of VMs "
        "under a workload policy that names the topology. Google builds new TPUs only there; the **Cloud TPU "
        "API** (google-cloud-tpu) gets bug fixes only, and makes the older types (v2-v5e, v4), or v6e and v5p with "
        "`--api tpu`. This notebook rehearses the workflow against **tpunb's sandbox**: both APIs emulated, their "
        "VMs real SSH hosts on this machine, so it runs anywhere for free.\n\n"
        "**On a real project, skip the sandbox cell** and configure a project instead: "
        "`gcloud auth application-default login`, then `GOOGLE_CLOUD_PROJECT` and `CLOUDSDK_COMPUTE_ZONE` "
        "(or `--project` / `--zone`, or gcloud's own configuration); in Colab, "
        "`tpunb.colab.authenticate(\"my-project\")`. Then `%tpu_launch v5p-16 --zone us-east5-a` "
        "makes a real slice, and every other cell runs as below."),
    new_code_cell("%load_ext tpunb"),
    new_code_cell("from tpunb.sandbox.box import start_sandbox\n\n"
                  "sandbox = start_sandbox()   # both APIs + sshd hosts; sets their endpoints, a project and a zone\n"
                  "sandbox"),
    new_markdown_cell("With a project configured, `%tpu_launch` uses Google Cloud (`--backend gcp`). A `v5p-16` is 8 "
                      "chips on 2 VMs (`ct5p-hightpu-4t`), so Compute Engine makes a workload policy (topology "
                      "2x2x2), an instance template and a MIG that makes both VMs at once. The progress shows each "
                      "step and the time it took."),
    new_code_cell("# NBVAL_IGNORE_OUTPUT\n%tpu_launch v5p-16 --zone us-east5-a --name trainer"),
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
    new_markdown_cell("The hosts are reached over SSH with tpunb's own key (in each VM's `ssh-keys` metadata). A MIG "
                      "lists its VMs in no particular order, so tpunb numbers the hosts by the worker id in each "
                      "VM's metadata, and gives `jax.distributed` its process ids and coordinator:"),
    new_code_cell("%%on_tpu\nimport jax\nprint('devices:', jax.device_count(), '| this host:', jax.local_device_count())\n"
                  "jax.process_index()"),
    new_markdown_cell("Google's own client, pointed at the sandbox, sees what the launch made, as `gcloud` would on "
                      "a real project: one MIG of 2 VMs, made all at once (`BULK`)."),
    new_code_cell("from google.api_core.client_options import ClientOptions\n"
                  "from google.auth.credentials import AnonymousCredentials\nfrom google.cloud import compute_v1\n\n"
                  "migs = compute_v1.InstanceGroupManagersClient(credentials=AnonymousCredentials(),\n"
                  "                                              client_options=ClientOptions(api_endpoint=sandbox.compute_url))\n"
                  "mig = migs.get(project=sandbox.project, zone='us-east5-a', instance_group_manager='trainer')\n"
                  "mig.target_size, mig.target_size_policy.mode, mig.status.is_stable"),
    new_markdown_cell("`%tpu_status` shows the cloud's view: state, uptime and the hourly list price."),
    new_code_cell("status = %tpu_status\nstatus[['slice', 'accelerator', 'backend', 'cloud_state', 'usd_per_hour', 'host']]"),
    new_markdown_cell("`%tpu_down` deletes the MIG, then its template and policy, and waits until they are gone; "
                      "nothing keeps billing."),
    new_code_cell("%tpu_down trainer"),
    new_markdown_cell("## Through the Cloud TPU API: `--api tpu`, spot capacity and `--recover`\n\n"
                      "`--api tpu` makes the same type as a Cloud TPU node. Spot capacity (`--spot`, either API) can be "
                      "reclaimed at any time. The sandbox can do that on demand; for a Cloud TPU node tpunb notices "
                      "it in the background, in `%tpu_status`, and before the next cell (on Compute Engine, so far, a "
                      "reclaimed VM is a host that died):"),
    new_code_cell("# NBVAL_IGNORE_OUTPUT\n%tpu_launch v5p-16 --api tpu --spot --zone us-east5-a --name spotty"),
    new_code_cell("sandbox.preempt('spotty')\nstatus = %tpu_status\nstatus[['slice', 'cloud_state']]"),
    new_code_cell("%%on_tpu\nprint('this will not run')", metadata={"tags": ["raises-exception"]}),
    new_markdown_cell("`--recover` deletes the lost node and launches the same spec again (state on the hosts "
                      "is lost, as it is with any preemption: checkpoint what matters)."),
    new_code_cell("# NBVAL_IGNORE_OUTPUT\n%tpu_launch --recover spotty"),
    new_code_cell("%%on_tpu\nimport jax\njax.device_count()"),
    new_code_cell("%tpu_down spotty"),
    new_code_cell("status = %tpu_status\nlen(status)"),
    new_code_cell("sandbox.stop()"),
]
write("02_cloud_workflow.ipynb", cells)
