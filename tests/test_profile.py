"""%tpu_profile against real multi-process JAX: traces recorded on every host, summarised there,
pulled back over the agent (local pipes and SSH), parsed again from Profile.path."""
from __future__ import annotations

import os
import re
import signal
import threading

import pytest

import tpunb
from tpunb.errors import CellInterrupted, HostDiedError, RemoteError
from tpunb.profile import Profile, ProfileError
from tpunb.profile.view import render
from tests.conftest import interrupt_kernel_when, wait_for, wait_for_files

pytestmark = pytest.mark.jax

TRAIN = """import jax, jax.numpy as jnp
@jax.jit
def train_step(x):
    return jnp.tanh(x @ x.T).sum()
@jax.jit
def evaluate(x):
    return jnp.sort(x).sum()
x = jnp.ones((64, 64))
"""


def train_step_calls(profile: Profile) -> dict:
    events = profile.events
    return events[events["name"] == "PjitFunction(train_step)"].groupby("host").size().to_dict()


@pytest.mark.fresh_slice
def test_profiled_cell_on_every_host_files_parse_again_and_errors_stop_the_profiler(patient_grouping, make_slice, cell):
    sl = make_slice(2)
    assert cell("%%on_tpu\n" + TRAIN).error is None
    run = cell("%%tpu_profile --name five\nfor _ in range(5):\n    train_step(x).block_until_ready()\nprint('trained')")
    assert run.error is None, run.shown
    assert "[0-1] trained" in run.stdout  # the cell's own output, as %%on_tpu shows it
    profile = tpunb.last_profile()
    assert profile is not None and profile.hosts == [0, 1]
    assert all(n >= 5 for n in train_step_calls(profile).values()) and set(train_step_calls(profile)) == {0, 1}
    assert {"host", "name", "start_us", "dur_us", "thread", "device"} <= set(profile.events.columns)
    top = profile.top(5)
    assert "PjitFunction(train_step)" in top.index
    assert {"host 0 ms", "host 1 ms", "slowest_host"} <= set(top.columns)
    steps = profile.steps
    assert steps is not None and steps.attrs["function"] == "train_step" and len(steps) == 5
    assert list(steps.columns) == [0, 1]
    # the straggler of the step table is the host with the slowest median step, read from the table itself
    assert steps.attrs["median_ms"] == pytest.approx(steps.median().to_dict())
    assert steps.attrs["straggler"] == steps.median().idxmax()
    assert profile.straggler == steps.attrs["straggler"]
    # the files are on the notebook machine, one folder per host, in the layout xprof reads
    assert profile.path.is_relative_to(tpunb.registry.tpunb_home() / "profiles" / sl.name)
    from jax.profiler import ProfileData

    for host in (0, 1):
        xplanes = list((profile.path / f"host-{host}" / "plugins" / "profile" / "five").glob("*.xplane.pb"))
        assert len(xplanes) == 1
        names = {e.name for p in ProfileData.from_file(str(xplanes[0])).planes for line in p.lines for e in line.events}
        assert "PjitFunction(train_step)" in names
    again = Profile.load(profile.path, reparse=True)
    assert again.hosts == [0, 1] and train_step_calls(again) == train_step_calls(profile)
    html = render(profile)
    assert "<canvas" in html and "straggler: host" in html and "PjitFunction(train_step)" in html
    assert not re.search(r"(src|href)=['\"]?https?:", html)  # offline: nothing fetched from the web

    # an exception in the profiled cell: the error as %%on_tpu shows it, and the profiler stopped everywhere
    failed = cell("%%tpu_profile\ntrain_step(x).block_until_ready()\nraise ValueError('bad batch')")
    assert isinstance(failed.error, RemoteError) and "ValueError: bad batch" in failed.stdout
    assert tpunb.last_profile() is not profile and tpunb.last_profile().hosts == [0, 1]
    assert all(n >= 1 for n in train_step_calls(tpunb.last_profile()).values())

    # the line form around several %%on_tpu cells, after the failed one
    assert cell("%tpu_profile start").error is None
    assert "recording on" in cell("%tpu_profile").stdout
    for _ in range(2):
        assert cell("%%on_tpu\nfor _ in range(3):\n    train_step(x).block_until_ready()").error is None
    assert cell("%%on_tpu\nevaluate(x).block_until_ready()").error is None
    stopped = cell("%tpu_profile stop")
    assert stopped.error is None, stopped.shown
    between = tpunb.last_profile()
    assert all(n == 6 for n in train_step_calls(between).values()) and len(train_step_calls(between)) == 2
    assert set(between.events[between.events["name"] == "PjitFunction(evaluate)"]["host"]) == {0, 1}
    listing = cell("%tpu_profile").stdout
    assert "no recording runs" in listing and between.path.name in listing and "five" in listing
    assert isinstance(cell("%tpu_profile stop").error, ProfileError)


@pytest.mark.fresh_slice
def test_capture_from_another_thread_while_a_cell_runs_and_an_interrupted_profile(make_slice, cell, flags):
    sl = make_slice(2)
    assert cell("%%on_tpu\n" + TRAIN).error is None
    captured: dict = {}

    def capture_then_release():
        wait_for_files(flags, ["0", "1"])  # both hosts are inside the training loop
        try:
            captured["profile"] = sl.capture(0.5)
        finally:
            (flags / "done").touch()

    threading.Thread(target=capture_then_release, daemon=True).start()
    run = cell(f"%%on_tpu\nimport os\nopen('{flags}/' + os.environ['TPUNB_HOST_INDEX'], 'w').close()\n"
               f"while not os.path.exists('{flags}/done'):\n    train_step(x).block_until_ready()\n'released'")
    assert run.error is None, run.shown
    assert "Out[0-1]: 'released'" in run.shown
    wait_for(lambda: "profile" in captured, what="the capture to finish")
    calls = train_step_calls(captured["profile"])
    assert set(calls) == {0, 1} and min(calls.values()) >= 1

    # an interrupted profiled cell: the profiler stops on every host, and the next profile works
    for f in flags.iterdir():
        f.unlink()
    interrupt_kernel_when(lambda: len(list(flags.iterdir())) == 2)
    interrupted = cell(f"%%tpu_profile\nimport os, time\nopen('{flags}/' + os.environ['TPUNB_HOST_INDEX'], 'w').close()\n"
                       "while True:\n    train_step(x).block_until_ready()")
    assert isinstance(interrupted.error, CellInterrupted)
    assert "interrupted on hosts 0-1" in str(interrupted.error)
    assert tpunb.last_profile().hosts == [0, 1] and min(train_step_calls(tpunb.last_profile()).values()) >= 1
    after = cell("%%tpu_profile\ntrain_step(x).block_until_ready()\n'again'")
    assert after.error is None and "Out[0-1]: 'again'" in after.shown
    assert set(train_step_calls(tpunb.last_profile())) == {0, 1}

    # a straggler: host 1 does more work between steps, so host 0 waits for it in every all-reduce
    slow = cell("%%tpu_profile\nimport numpy as np, time\nfrom jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
                "mesh = Mesh(np.array(jax.devices()), ('data',))\n"
                "xs = jax.make_array_from_process_local_data(NamedSharding(mesh, P('data')), np.ones((8, 8), 'float32'))\n"
                "total = jax.jit(lambda v: v.sum())\n"
                "for _ in range(8):\n    if jax.process_index() == 1:\n        time.sleep(0.02)  # the slow host's own work\n"
                "    total(xs).block_until_ready()")
    assert slow.error is None, slow.shown
    assert tpunb.last_profile().straggler == 1
    assert tpunb.last_profile().straggler_reason.startswith("host 1 spends the least time inside collectives")

    # a forgotten stop: the recording ends by itself at its limit, and stop still collects it, with a note
    assert cell("%tpu_profile start --limit 0.5").error is None
    assert cell("%%on_tpu\ntrain_step(x).block_until_ready()").error is None
    wait_for(lambda: not any(r["recording"] for r, _ in sl.session.call([0, 1], {"op": "profile_status"}).values()),
             what="the recording to end at its limit")
    assert cell("%tpu_profile stop").error is None
    notes = tpunb.last_profile().notes
    assert [n for n in notes if "ended by itself after 0.5 s" in n] and len(notes) == 2
    assert set(train_step_calls(tpunb.last_profile())) == {0, 1}


@pytest.mark.fresh_slice
def test_host_without_jax_gives_one_clear_line_and_a_host_dying_while_profiled(make_slice, cell, flags):
    sl = make_slice(1)
    hide = ("%%on_tpu\nimport sys\nkept_path = list(sys.path)\n"
            "sys.path[:] = [p for p in sys.path if 'site-packages' not in p and 'dist-packages' not in p]")
    assert cell(hide).error is None
    run = cell("%%tpu_profile\nprint('never runs')")
    assert isinstance(run.error, ProfileError)
    message = str(run.error)
    assert "host 0 cannot profile: no JAX on this host" in message and "install jax" in message
    assert "\n" not in message and "never runs" not in run.stdout
    assert isinstance(cell("%tpu_profile start").error, ProfileError)
    assert "no recording runs" in cell("%tpu_profile").stdout
    assert cell("%%on_tpu\nsys.path[:] = kept_path").error is None
    ok = cell("%%tpu_profile --python-tracer\nimport jax\njax.jit(lambda v: v + 1)(1)")
    assert ok.error is None and tpunb.last_profile().hosts == [0]
    assert (tpunb.last_profile().events["kind"] == "python").any()  # Python calls, asked for
    plain = cell("%%tpu_profile\njax.jit(lambda v: v + 2)(1)")
    assert plain.error is None and not (tpunb.last_profile().events["kind"] == "python").any()

    # the host dies while profiled: the cell fails as %%on_tpu would say, and the next profile works
    victim = sl.session.hosts[0].info["pid"]
    threading.Thread(target=lambda: (wait_for_files(flags, ["0"]), os.kill(victim, signal.SIGKILL)), daemon=True).start()
    died = cell(f"%%tpu_profile\nimport time\nopen('{flags}/0', 'w').close()\nwhile True:\n    time.sleep(0.01)")
    assert isinstance(died.error, HostDiedError) and "host 0 died" in str(died.error)
    again = cell("%%tpu_profile\nimport jax\njax.jit(lambda v: v + 3)(1)")
    assert again.error is None and tpunb.last_profile().hosts == [0]


def test_view_caps_what_it_draws_and_tables_keep_every_event():
    names = ["PjitFunction(train_step)", "fusion.1"]
    summaries = {}
    for host in (0, 1):
        events = [[i % 2, 0, 0, 10**18 + i * 1000, 500 + host * 100] for i in range(50_000)]
        summaries[host] = {"origin_ns": 10**18, "names": names, "kinds": ["jit", "op"], "threads": ["python3"],
                           "devices": ["/host:CPU"], "events": events, "total_events": 60_000,
                           "totals": {"PjitFunction(train_step)": [30_000, 30_000 * (500 + host * 100)],
                                      "fusion.1": [30_000, 30_000 * (500 + host * 100)]}}
    profile = Profile(tpunb.registry.tpunb_home() / "synthetic", summaries, {"slice": "s"})
    html = render(profile)
    assert "the timeline draws the 40,000 longest of 100,000 events" in html
    assert "60,000 events, the earliest 50,000 are in .events" in html
    assert profile.top(1)["slowest_host"].iloc[0] == 1 and profile.top(1)["calls"].iloc[0] == 30_000
    assert profile.straggler == 1 and abs(profile.steps.attrs["slower_by"] - 0.2) < 1e-9
    assert len(profile.events) == 100_000
