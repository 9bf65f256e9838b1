"""%tpu_snapshot and %tpu_restore on real multi-process JAX: a global jax.Array saved with orbax
from a v4-16 (2 hosts, 8 devices) comes back re-sharded on a v4-8 (1 host, 4 devices), with the
per-host values beside it; every bad input is one line and leaves nothing half-done."""
from __future__ import annotations

import pytest
import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

from tpunb.errors import CellInterrupted
from tests.conftest import interrupt_kernel_when


MAKE = ("%%on_tpu\nimport jax, numpy as np\nfrom jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = jax.make_mesh((8,), ('x',))\n"
        "full = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)\n"
        "x = jax.make_array_from_callback(full.shape, NamedSharding(mesh, P('x')), lambda i: full[i])\n"
        "n = 7\nmine = jax.process_index() * 10\nit = iter(range(10))\nnext(it)\n"
        "len(x.addressable_shards)")


def one_line(run) -> str:
    """The error a magic ended with, as the notebook shows it: one line, no traceback."""
    assert run.error is not None, run.shown
    rendered = run.error._render_traceback_()
    assert len(rendered) == 1 and "\n" not in rendered[0], rendered
    return str(run.error)


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_snapshot_on_a_v4_16_restores_onto_a_v4_8_resharded(cell, tmp_path):
    assert cell("%tpu_launch v4-16").error is None
    made = cell(MAKE)
    assert made.error is None and "Out[0-1]: 4" in made.shown, made.shown
    target = tmp_path / "snap"
    saved = cell(f"%tpu_snapshot x n mine it --to {target}")
    assert saved.error is None, saved.shown
    assert "snapshot of x, n, mine, it" in saved.shown and "from v4-16 (2 hosts, 8 devices)" in saved.shown, saved.shown
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["hosts"] == 2 and manifest["devices"] == 8 and sorted(manifest["names"]) == ["it", "mine", "n", "x"]
    assert manifest["arrays"]["x__0"]["sharding"]["spec"] == ["x"]
    assert manifest["names"]["n"]["same_on_all_hosts"] and not manifest["names"]["mine"]["same_on_all_hosts"]
    listed = cell("%tpu_snapshot --list")
    assert listed.error is None and "it, mine, n, x" in listed.shown, listed.shown
    assert "v4-16 (2 hosts, 8 devices)" in listed.shown and "complete" in listed.shown, listed.shown
    assert cell("%tpu_down").error is None
    assert cell("%tpu_launch v4-8").error is None
    # a value that differed between the 2 hosts cannot go to 1 host: one line, and nothing is loaded
    refused = one_line(cell(f"%tpu_restore {target}"))
    assert refused == ("mine differed between the 2 hosts it was saved from, and this slice has 1 host: restore it "
                       "onto 2 hosts, or restore the other names alone"), refused
    assert "NameError" in cell("%%on_tpu\nn").shown
    back = cell(f"%tpu_restore {target} x n it")
    assert back.error is None, back.shown
    assert "restored x, n, it onto v4-8 (1 host) from a snapshot of v4-16 (2 hosts, 8 devices)" in back.shown, back.shown
    assert "x as P('x',) over 4 devices" in back.shown, back.shown
    check = cell("%%on_tpu\nimport numpy as np\n"
                 "(n, bool((np.asarray(x) == np.arange(1024, dtype=np.float32).reshape(64, 16)).all()), "
                 "len(x.sharding.device_set), str(x.sharding.spec), x.dtype.name, next(it))")
    assert check.error is None and "(7, True, 4, \"P('x',)\", 'float32', 1)" in check.shown, check.shown


BAD = ("%%on_tpu\nimport jax, threading, numpy as np\nfrom jax.sharding import NamedSharding, PartitionSpec as P\n"
       "mesh = jax.make_mesh((4,), ('x',))\n"
       "z = jax.device_put(np.arange(12 * 4, dtype=np.int32).reshape(12, 4), NamedSharding(mesh, P('x')))\n"
       "w = jax.device_put(np.random.default_rng(0).random((512, 1024), np.float32), NamedSharding(mesh, P('x')))\n"
       "n = 3\nlock = threading.Lock()\n"
       "if jax.process_index() == 0:\n    only0 = 1\n"
       "big = np.ones(2 * 2**20 // 8)")


@contextlib.contextmanager
def small_disk(path: Path, size: str = "1m"):
    """A tmpfs of ``size`` at ``path``: a full disk, for real."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.fresh_slice
@pytest.mark.jax
def test_bad_inputs_are_one_line_and_leave_nothing_half_done(cell, tmp_path):
    assert cell("%tpu_launch v4-8").error is None
    assert cell(BAD).error is None
    target = tmp_path / "bad"
    missing = one_line(cell(f"%tpu_snapshot n nothing --to {target}"))
    assert missing == ("not defined: nothing on host 0: define it there (%%on_tpu), or snapshot other names"), missing
    assert not target.exists(), "a refused snapshot left its folder"
    unpicklable = one_line(cell(f"%tpu_snapshot n lock --to {target}"))
    assert unpicklable.startswith("lock cannot be pickled on host 0 (TypeError: cannot pickle '_thread.lock' object)"), unpicklable
    assert not target.exists()
    usage = one_line(cell("%tpu_snapshot"))
    assert usage.startswith("give the host variables to save"), usage
    with small_disk(tmp_path / "full") as full:
        no_room = one_line(cell(f"%tpu_snapshot n big --to {full / 'snap'}"))
        assert no_room.startswith("host 0: no space left writing big on host 0"), no_room
        assert not (full / "snap").exists(), os.listdir(full)
        arrays_no_room = one_line(cell(f"%tpu_snapshot w --to {full / 'snap2'}"))
        assert "no space left" in arrays_no_room, arrays_no_room
        assert not (full / "snap2" / "manifest.json").exists()
    good = tmp_path / "good"
    assert cell(f"%tpu_snapshot z n --to {good}").error is None
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    refused = one_line(cell(f"%tpu_snapshot n --to {other}"))
    assert refused == f"host 0: {other} holds other files: snapshot to a new or empty folder", refused
    assert (other / "notes.txt").read_text() == "mine"
    assert cell("%tpu_down").error is None
    assert cell("%tpu_launch v4-16").error is None
    axis = one_line(cell(f"%tpu_restore {good}"))
    assert axis == ("z: dimension 0 (size 12) is split over mesh axis 'x' of size 8 on 8 devices, which does not "
                    "divide it: restore onto a slice where 12 is a multiple of that axis (the saved mesh was "
                    "('x': 4))"), axis
    assert "NameError" in cell("%%on_tpu\nn").shown, "n was restored although the restore was refused"
    absent = one_line(cell(f"%tpu_restore {good} nothing"))
    assert absent == "nothing is not in this snapshot (it holds n, z)", absent
    nowhere = one_line(cell(f"%tpu_restore {tmp_path / 'nowhere'}"))
    assert nowhere.startswith(f"no snapshot at {tmp_path / 'nowhere'}"), nowhere
    assert cell(f"%tpu_restore {good} n").error is None
    assert "Out[0-1]: 3" in cell("%%on_tpu\nn").shown


SLOW = ("%%on_tpu\nimport time, numpy as np\nclass Slow:\n    def __reduce__(self):\n        time.sleep(120)\n"
        "        return (Slow, ())\nslow = Slow()\nn = 1\n"
        "big = np.random.default_rng(0).random(24 * 2**20 // 8)")


@pytest.mark.fresh_slice
def test_ctrl_c_leaves_no_snapshot_that_looks_complete_and_big_ones_show_a_bar(cell, tmp_path):
    assert cell("%tpu_launch v4-16").error is None
    assert cell(SLOW).error is None
    target = tmp_path / "cut"
    interrupt_kernel_when(lambda: (target / "host-0" / "n.pkl").exists() and (target / "host-1" / "n.pkl").exists())
    cut = cell(f"%tpu_snapshot n slow --to {target}")
    assert isinstance(cut.error, CellInterrupted), cut.shown
    assert "interrupted during prepare" in str(cut.error), str(cut.error)
    assert not (target / "manifest.json").exists()
    assert not target.exists(), "the interrupted snapshot's files were left"
    refused = one_line(cell(f"%tpu_restore {target}"))
    assert refused.startswith(f"no snapshot at {target}"), refused
    assert "Out[0-1]: 1" in cell("%%on_tpu\nn").shown  # the hosts stopped cleanly and kept their state
    shown = cell(f"%tpu_snapshot big n --to {tmp_path / 'big'}")
    assert shown.error is None, shown.shown
    assert "snapshot big, n" in shown.stderr and "48.0M" in shown.stderr, shown.stderr  # tqdm's bar, 2 x 24 MiB


@pytest.mark.fresh_slice
def test_arming_a_slice_without_metadata_keeps_sigterm_ending_a_host(cell):
    """No metadata server confirms a notice here, so SIGTERM still ends a host as it always did
    (the last step of an escalating interrupt), armed or not."""
    from tpunb import manager
    from tests.conftest import wait_for

    assert cell("%tpu_launch v4-8").error is None
    armed = cell("%tpu_snapshot --on-preempt n,step")
    assert armed.error is None and "(but these hosts have no metadata server" in armed.stdout, armed.shown
    sl = manager.current()
    os.kill(sl.session.hosts[0].info["pid"], signal.SIGTERM)
    wait_for(lambda: sl.session.dead_hosts() == [0], 10, "the armed host to end on SIGTERM")
