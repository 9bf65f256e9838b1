"""Multi-host JAX on the local simulated slice: real processes joined by jax.distributed."""
from __future__ import annotations

import pytest
from tests.conftest import wait_for

pytestmark = pytest.mark.jax


@pytest.mark.fresh_slice
def test_first_cell_sees_the_whole_slice_and_computes_across_hosts(patient_grouping, make_slice, cell):
    make_slice(2)
    devices = cell("%%on_tpu\nimport jax\nprint(jax.device_count(), jax.local_device_count(), jax.process_count())\n"
                   "jax.process_index()")
    assert devices.error is None, devices.shown
    assert devices.stdout.strip() == "[0-1] 8 4 2"  # v4-16: 2 hosts x 4 chips, no set-up code
    assert "Out[0]: 0" in devices.shown and "Out[1]: 1" in devices.shown
    again = cell("%%on_tpu\nimport jax\njax.distributed.initialize()\njax.device_count()")  # users' own call
    assert again.error is None and "Out[0-1]: 8" in again.shown
    total = cell(
        "%%on_tpu\nimport jax, jax.numpy as jnp, numpy as np\n"
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
        "mesh = Mesh(np.array(jax.devices()), ('data',))\n"
        "local = np.arange(4.0) + 4 * jax.process_index()\n"
        "x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('data')), local)\n"
        "float(jax.jit(jnp.sum)(x))")
    assert total.error is None, total.shown
    assert "Out[0-1]: 28.0" in total.shown  # 0+1+...+7, half the array on each host
    assert "Gloo" not in total.stdout + total.stderr


@pytest.mark.fresh_slice
def test_jax_on_a_subset_warns_and_still_starts_every_host(make_slice, cell):
    make_slice(2)
    run = cell("%%on_tpu --hosts 0\nimport jax\njax.device_count()")
    assert "JAX collectives (jit over the whole slice, psum, ...) would hang" in run.stderr
    assert run.error is None and "Out[0]: 8" in run.shown  # host 1 joined in the background
    assert "Out[1]: 8" in cell("%%on_tpu --hosts 1\nimport jax\njax.device_count()").shown


@pytest.mark.fresh_slice
def test_a_dead_host_restarts_the_whole_jax_slice(make_slice, cell):
    sl = make_slice(2)
    assert cell("%%on_tpu\nimport jax\nkept = jax.device_count()").error is None
    sl.session.hosts[1].signal(9)
    wait_for(lambda: not sl.session.hosts[1].alive, what="the death of host 1 to be noticed")
    run = cell("%%on_tpu\nimport jax\n('kept' in globals(), jax.device_count())")
    assert "all hosts 0-1 were restarted: their state was lost" in run.stderr
    assert run.error is None and "Out[0-1]: (False, 8)" in run.shown


@pytest.mark.fresh_slice
def test_flax_data_parallel_step_across_hosts(make_slice, cell):
    make_slice(2)
    run = cell(
        "%%on_tpu\nimport jax, jax.numpy as jnp, numpy as np, optax\nfrom flax import nnx\n"
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
        "mesh = Mesh(np.array(jax.devices()), ('data',))\n"
        "model = nnx.Linear(4, 1, rngs=nnx.Rngs(0))\n"
        "opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)\n"
        "rng = np.random.default_rng(jax.process_index())\n"
        "xs = jax.make_array_from_process_local_data(NamedSharding(mesh, P('data')), rng.normal(size=(8, 4)).astype('float32'))\n"
        "ys = jax.make_array_from_process_local_data(NamedSharding(mesh, P('data')), np.ones((8, 1), 'float32'))\n"
        "@nnx.jit\n"
        "def step(model, opt, x, y):\n"
        "    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)\n"
        "    opt.update(model, grads)\n"
        "    return loss\n"
        "losses = [float(step(model, opt, xs, ys)) for _ in range(5)]\n"
        "print('decreasing', losses[-1] < losses[0])\n"
        "round(losses[-1], 5)")
    assert run.error is None, run.shown
    assert "[0-1] decreasing True" in run.stdout
    assert "Out[0-1]:" in run.shown  # the same global loss on both hosts


@pytest.mark.fresh_slice
def test_a_host_that_fails_to_start_jax_when_another_does_is_said_once(make_slice, cell):
    sl = make_slice(2)
    assert cell("%%on_tpu --hosts 1\nimport os\nos.environ['JAX_PLATFORMS'] = 'tpu'").error is None  # no TPU here
    started = cell("%%on_tpu --hosts 0\nimport jax\n'joined'")  # host 1 joins in the background, and fails
    assert started.error is None and "Out[0]: 'joined'" in started.shown, started.shown
    # host 1's failure may arrive before host 0's answer (then that cell says it) or after it (the next one)
    wait_for(lambda: "could not start JAX" in started.stderr or not sl.session.jax_failures.empty(),
             what="host 1's failed JAX start")
    both = started.stderr + cell("%%on_tpu --hosts 0\n1").stderr
    said = [line for line in both.splitlines() if "could not start JAX" in line]
    assert len(said) == 1 and said[0].startswith("[tpunb] host 1 could not start JAX when another host did (RuntimeError: ")
    assert said[0].endswith("run exit() on it (%%on_tpu --hosts 1) to restart the slice's hosts")
    assert "could not start JAX" not in cell("%%on_tpu --hosts 0\n2").stderr  # said once
