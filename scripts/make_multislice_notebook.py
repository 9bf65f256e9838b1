"""Writes notebooks/07_multislice.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_multislice_notebook.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import write

cells = [
    new_markdown_cell(
        "# Multislice: several TPU slices as one JAX job\n\n"
        "Inside a slice, chips talk over ICI, the fast links between neighbouring chips. A **multislice** joins "
        "several slices over the data-centre network (DCN), which is several times slower per chip, so the "
        "largest jobs keep their chatty axes (tensor, FSDP) inside a slice and put data parallelism across "
        "slices: one gradient all-reduce over DCN per step.\n\n"
        "`%tpu_launch v4-16 --slices 2` makes one: every host of both slices in one JAX job, numbered slice by "
        "slice as JAX numbers processes. In tpunb it is one slice: one name, one status, one cost, one "
        "`%tpu_down`. Here it is simulated on this machine (4 host processes, JAX on CPU), so you can get the "
        "mesh right before paying for two pods; the last section says what changes on real ones."),
    new_code_cell("%load_ext tpunb\n%tpu_launch v4-16 --slices 2"),
    new_markdown_cell(
        "Output is labelled `slice/host`: `s1/0` is host 0 of slice 1, and a whole slice is `s1` (`s0-1`: "
        "every host of both). Each host gets the environment JAX's multislice runtime reads on Cloud TPU, plus "
        "`TPUNB_SLICE_INDEX`; `TPUNB_HOST_INDEX` counts over all slices, as `jax.process_index()` does:"),
    new_code_cell(
        "%%on_tpu\nimport os\n"
        "for key in ('MEGASCALE_COORDINATOR_ADDRESS', 'MEGASCALE_NUM_SLICES', 'MEGASCALE_SLICE_ID', "
        "'TPUNB_SLICE_INDEX'):\n"
        "    print(f'{key}={os.environ[key]}')\n"
        "int(os.environ['TPUNB_HOST_INDEX'])"),
    new_code_cell(
        "%%on_tpu\nimport jax\n"
        "print(jax.process_count(), 'processes,', jax.device_count(), 'devices,', jax.local_device_count(), "
        "'on each host')"),
    new_markdown_cell(
        "## A hybrid mesh\n\n"
        "The mesh gets a `\"dcn\"` axis, one entry per slice, and a `\"data\"` axis over the chips of a slice. "
        "On Cloud TPU every device knows its slice (`device.slice_index`), and "
        "`mesh_utils.create_hybrid_device_mesh` builds this mesh with the best device order inside each slice. "
        "Simulated CPU devices all say slice 0, so there the cell orders devices by process: slices are "
        "consecutive processes. The same cell runs unchanged on both."),
    new_code_cell(
        "%%on_tpu\nimport numpy as np\nfrom jax.experimental import mesh_utils\nfrom jax.sharding import Mesh\n\n"
        "slices = int(os.environ['MEGASCALE_NUM_SLICES'])\n"
        "per_slice = jax.device_count() // slices\n"
        "slice_ids = {getattr(d, 'slice_index', 0) for d in jax.devices()}\n"
        "if len(slice_ids) == slices:   # Cloud TPU: devices know their slice\n"
        "    devices = mesh_utils.create_hybrid_device_mesh((1, per_slice), (slices, 1))\n"
        "else:                          # simulated: CPU devices all say 0; slices are consecutive processes\n"
        "    devices = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))).reshape(slices, per_slice)\n"
        "mesh = Mesh(devices, ('dcn', 'data'))\n"
        "print(dict(mesh.shape), 'row 1 holds the devices of processes', sorted({d.process_index for d in mesh.devices[1]}))"),
    new_markdown_cell(
        "## A sum across slices\n\n"
        "Each slice fills its row of a global array with its own number (slice 0: 1, slice 1: 10). `psum` over "
        "`\"dcn\"` adds the rows across slices, the same collective a data-parallel gradient all-reduce does "
        "between slices; over `\"data\"` it would stay inside a slice, on ICI."),
    new_code_cell(
        "%%on_tpu\nfrom jax.sharding import NamedSharding, PartitionSpec as P\n\n"
        "slice_id = int(os.environ['MEGASCALE_SLICE_ID'])\n"
        "mine = np.full((1, jax.local_device_count()), 10.0 ** slice_id)\n"
        "x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('dcn', 'data')), mine)\n\n"
        "@jax.jit\n"
        "@jax.shard_map(mesh=mesh, in_specs=P('dcn', 'data'), out_specs=P(None, 'data'))\n"
        "def across_slices(block):\n"
        "    return jax.lax.psum(block, 'dcn')\n\n"
        "total = across_slices(x)\n"
        "value = float(total.addressable_data(0)[0, 0])\n"
        "assert value == 11.0, value\n"
        "print(f'slice {slice_id} gave {mine[0, 0]:g}; the sum across slices is {value:g} on every host')"),
    new_markdown_cell(
        "## Picking slices and hosts\n\n"
        "`--hosts` takes slices too: `s1` (slice 1), `s1/0` (host 0 of slice 1), `s*/0` (host 0 of every slice), "
        "besides the global numbers (`0`, `1:3`). A subset cannot join the others' collectives, so tpunb warns "
        "once JAX runs:"),
    new_code_cell("%%on_tpu --hosts s*/0\nprint('first host of slice', os.environ['TPUNB_SLICE_INDEX'])"),
    new_markdown_cell(
        "`%tpu_status` shows the multislice as one slice (`2 x v4-16`, its price the sum of both) with a "
        "`slice_index` column; `%tpu_down` ends all of it."),
    new_code_cell("status = %tpu_status\nstatus[['slice', 'accelerator', 'slice_index', 'host', 'state']]"),
    new_code_cell("%tpu_down"),
    new_markdown_cell(
        "## On real pods\n\n"
        "With a Google Cloud project configured, the same command launches real slices, e.g. "
        "`%tpu_launch v5litepod-256 --slices 2 --zone us-west4-a` (or "
        "`tpunb.launch('v5litepod-256', slices=2, zone='us-west4-a')`):\n\n"
        "- It creates **one queued resource** whose node spec asks for 2 nodes (`multisliceParams`: node count 2, "
        "name prefix = the slice's name), so the nodes are `NAME-0` and `NAME-1`. The launch waits until every "
        "node is READY; if it fails, times out (`--timeout`) or you interrupt it, the queued resource and all its "
        "nodes are deleted.\n"
        "- `MEGASCALE_COORDINATOR_ADDRESS` is host 0 of slice 0 (its internal IP, port 8080), "
        "`MEGASCALE_SLICE_ID` each host's slice: libtpu reads them to run `\"dcn\"` collectives over the "
        "data-centre network, and JAX numbers processes slice by slice, as here.\n"
        "- Devices carry `slice_index`, so the mesh cell takes its first branch. `jax.make_mesh` refuses a "
        "multislice topology: use `create_hybrid_device_mesh` there.\n"
        "- The price shown is every slice's, `%tpu_status` is one slice with a `slice_index` per host, and "
        "`%tpu_down` deletes the queued resource with its nodes and waits until all are gone. "
        "`--idle-delete` does not cover a multislice yet."),
]

write("07_multislice.ipynb", cells)
