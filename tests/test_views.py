"""Views of a slice's hosts: ``sl[1:3]``, ``sl[-1]`` and ``sl.hosts("s1")`` have the slice's verbs
and work on their hosts only; a ``hosts=`` outside the view is refused in one line; ``block=False``
returns the Run (a Future) that background cells return. Views are the kernel's own: one
transport shows them."""
from __future__ import annotations

import concurrent.futures

import pytest

from tpunb import manager
from tpunb.engine.background import Run
from tpunb.errors import UsageError
from tpunb.slice import HostsView

pytestmark = pytest.mark.parametrize("make_slice", ["local"], indirect=True)

WHO = "import os\nint(os.environ['TPUNB_HOST_INDEX'])"


def test_a_view_runs_pushes_and_pulls_on_its_hosts_only(make_slice):
    sl = make_slice(4)
    middle = sl[1:3]
    assert isinstance(middle, HostsView) and middle.targets == [1, 2]
    ran = middle.run(WHO, output=None)
    assert sorted(ran) == [1, 2] and ran.reprs == {1: "1", 2: "2"}
    middle.push({"given": 7})
    assert middle.pull("given") == {1: 7, 2: 7}
    assert sl.run("'given' in globals()", output=None).reprs == {0: "False", 1: "True", 2: "True", 3: "False"}
    assert sl[-1].run(WHO, output=None).reprs == {3: "3"}
    assert middle[1].targets == [2] and middle.hosts("2").targets == [2]  # positions in a view; names in the slice
    with pytest.raises(TypeError):
        list(middle)  # not a sequence of hosts: no iteration through __getitem__ until it fails


def test_a_verbs_hosts_outside_its_view_are_refused_in_one_line(make_slice):
    sl = make_slice(4)
    with pytest.raises(UsageError) as refused:
        sl[0:2].run(WHO, hosts=3, output=None)
    assert "hosts 3 are not in this view of hosts 0-1" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(UsageError, match="this view has 4 hosts"):
        sl[4]
    with pytest.raises(UsageError, match="picks no host"):
        sl[3:1]
    assert sl[0:2].run(WHO, hosts=1, output=None).reprs == {1: "1"}


def test_block_false_returns_the_future_a_background_cell_returns(make_slice):
    sl = make_slice(2)
    run = sl[1:].run("6 * 7", block=False, output=None)
    assert isinstance(run, Run) and isinstance(run, concurrent.futures.Future) and run.hosts == [1]
    assert run.result(timeout=60).reprs == {1: "42"}
    assert manager.last_run() is run  # the kernel's handle, as for %%on_tpu --bg


@pytest.mark.fresh_slice
def test_a_multislice_view_names_a_slice_of_it(make_slice):
    sl = manager.launch("v4-16", slices=2, backend="local")
    second = sl.hosts("s1")
    assert second.targets == [2, 3] and repr(second) == f"<tpunb hosts s1 of slice {sl.name!r}>"
    assert second.run(WHO, output=None).reprs == {2: "2", 3: "3"}
