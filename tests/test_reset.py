"""Slice.reset: every host back to how its session started, in one host op and no restart: an
empty namespace, the environment and working directory as they were; the variables a cell had
changed are named, and on a remote host what lies in its tpunb folders is listed."""
from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.fresh_slice


def test_reset_empties_namespaces_and_puts_the_environment_back_without_a_restart(make_slice, cell):
    sl = make_slice(2)
    pids = [h.info["pid"] for h in sl.session.hosts]
    cell("%%on_tpu\nimport os\nkept = 1\nos.environ['ADDED_BY_A_CELL'] = '1'\nos.environ['TPUNB_SLICE'] = 'changed'\n"
         "os.chdir('/')")
    found = sl.reset()
    assert {i: f["environ"] for i, f in found.items()} == {i: ["ADDED_BY_A_CELL", "TPUNB_SLICE"] for i in (0, 1)}
    run = cell("%%on_tpu\nimport os\n('kept' in globals(), os.environ.get('ADDED_BY_A_CELL'), os.environ['TPUNB_SLICE'], "
               "os.getcwd() != '/')")
    assert f"Out[0-1]: (False, None, {sl.name!r}, True)" in run.shown, run.shown
    assert [h.info["pid"] for h in sl.session.hosts] == pids  # the same agents: no restart
    assert {i: f["environ"] for i, f in sl.reset().items()} == {0: [], 1: []}  # nothing changed since


@pytest.mark.parametrize("make_slice", ["ssh"], indirect=True)  # a remote host's own folders
def test_reset_lists_what_lies_in_a_remote_hosts_tpunb_folders(make_slice, cell):
    sl = make_slice(1)
    before = sl.reset()[0]["folders"]["~/.tpunb"]
    cell("%%on_tpu\nimport os\nos.makedirs(os.path.expanduser('~/.tpunb/left'), exist_ok=True)\n"
         "open(os.path.expanduser('~/.tpunb/left/behind'), 'w').close()")
    try:
        after = sl.reset()[0]["folders"]["~/.tpunb"]
        assert sorted(set(after) - set(before)) == [os.path.join("left", "behind")]
    finally:
        cell("%%on_tpu\nimport os, shutil\nshutil.rmtree(os.path.expanduser('~/.tpunb/left'))")


def test_a_folder_with_more_than_the_listing_holds_lists_its_newest(tmp_path):
    from tpunb.host.agent import folders

    for age, name in enumerate(["e", "d", "c", "b", "a"]):  # "a" oldest, "e" newest
        (tmp_path / "sub").mkdir(exist_ok=True)
        path = tmp_path / "sub" / name
        path.write_text("")
        os.utime(path, ns=(age * 10**9, (10 - age) * 10**9))
    assert folders({str(tmp_path): True}, most=3) == {str(tmp_path): ["sub/c", "sub/d", "sub/e"]}
    assert folders({str(tmp_path): False}, most=3) == {str(tmp_path): ["sub"]}  # its own entries only
    assert folders({str(tmp_path): True}) == {str(tmp_path): [f"sub/{n}" for n in "abcde"]}
