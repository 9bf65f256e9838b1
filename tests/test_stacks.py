"""Where every host is: %tpu_stacks, Slice.stacks() and `python -m tpunb stacks`, read from a signal
handler while hosts are blocked in C (GIL held or not), grouped by identical stacks; dead and
frozen hosts said per host; native frames through py-spy; tpunb's own frames never shown."""
from __future__ import annotations

import pytest
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tpunb.stuck.stack_frames import parse_faulthandler
from tpunb.stuck.stacks import HostStacks, Stacks, from_reply
from tpunb.host import stacks as host_stacks
from tpunb.transport.bundle import STACKS_READER, stacks_source
from tests.conftest import wait_for, wait_for_files

ROOT = Path(__file__).resolve().parent.parent

#: host 0 waits in a blocked open of a FIFO (C, GIL released), host 1 in a regex that never ends (C, GIL held);
#: a thread of the user's waits on every host
STUCK = """import os, re, threading
def worker(stop):
    stop.wait()
stop = threading.Event()
threading.Thread(target=worker, args=(stop,), daemon=True).start()
def waiting(path):
    os.read(os.open(path, os.O_RDONLY), 1)
def spinning():
    re.match(r"(a+)+$", "a" * 64 + "b")
here = os.environ['TPUNB_HOST_INDEX']
open(FLAGS + '/' + here, 'w').close()
spinning() if here == '1' else waiting(FLAGS + '/fifo')
"""


def run_in_background(sl, code: str) -> dict:
    """Run a cell on a thread (as a second kernel thread would); its result lands in the dict."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", sl.run(code, output=None, timeout=300)),
                              daemon=True)
    thread.start()
    box["thread"] = thread
    return box


@pytest.mark.fresh_slice
def test_stacks_of_hosts_blocked_in_c_with_and_without_the_gil(make_slice, flags, cell):
    sl = make_slice(2)
    sl.heartbeat_timeout = 0  # host 1 holds its GIL: it cannot beat, and would count as frozen after 5 s
    assert "[0-1] main thread: not in a cell" in cell("%tpu_stacks").stdout
    os.mkfifo(flags / "fifo")
    box = run_in_background(sl, f"FLAGS = {str(flags)!r}\n" + STUCK)
    wait_for_files(flags, ["0", "1"])
    stacks = wait_for(lambda: _settled(sl.stacks()), 30, "both hosts inside their blocking call")

    assert re.fullmatch(r"In\[\d+\]:13 <module> -> In\[\d+\]:8 waiting", stacks[0].where), stacks[0].where
    assert re.fullmatch(r"In\[\d+\]:13 <module> -> In\[\d+\]:10 spinning -> match", stacks[1].where), stacks[1].where
    text = stacks.text()
    assert re.search(r"^\[0\] main thread: In\[\d+\]:13 <module> -> In\[\d+\]:8 waiting$", text, re.M), text
    assert re.search(r"^\[1\] main thread: .* spinning -> match$", text, re.M), text
    # the user's thread is the same on both hosts: one group, from the user's frame on (threading's
    # start-up cut off), down to the library call it waits in
    assert re.search(r"^\[0-1\] thread: In\[\d+\]:4 worker -> wait$", text, re.M), text
    worker = next(t for hosts, t in stacks.groups() if hosts == [0, 1] and not t.main)
    assert worker.frames[0].function == "worker" and worker.frames[0].kind == "user"
    assert worker.frames[-1].function == "wait" and worker.frames[-1].file.endswith("threading.py")
    assert "tpunb" not in text.replace("[tpunb] stacks of", "") and "agent" not in text  # our frames are hidden

    shown = cell("%tpu_stacks --hosts 1").stdout  # the magic, while the cell runs on another thread
    assert "(1 host," in shown and re.search(r"^\[1\] main thread: .* spinning -> match$", shown, re.M), shown

    native = sl.stacks(hosts=[0], native=True)  # py-spy on the host: C frames under the Python ones
    main = native[0].main
    assert main is not None and any(f.kind == "native" for f in main.frames), native.text()
    assert re.search(r"In\[\d+\]:8 waiting", native.text()) and not native[0].native_error

    outside = subprocess.run([sys.executable, "-m", "tpunb", "stacks", sl.name], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert outside.returncode == 0, outside.stderr
    assert re.search(r"^\[1\] main thread: In\[\d+\]:13 <module> -> In\[\d+\]:10 spinning -> match$",
                     outside.stdout, re.M), outside.stdout
    assert re.search(r"^\[0\] main thread: .*:8 waiting$", outside.stdout, re.M), outside.stdout

    os.kill(sl.session.hosts[1].info["pid"], signal.SIGKILL)  # ends the cell: a host died
    box["thread"].join(60)
    assert box["result"][1].status == "died"
    after = sl.stacks()
    assert "killed by SIGKILL" in after[1].error and after[0].main is not None
    assert re.search(r"^\[1\] its agent is not running \(killed by SIGKILL\)$", after.text(), re.M), after.text()


@pytest.mark.fresh_slice
def test_a_frozen_host_is_said_and_the_others_shown(make_slice):
    sl = make_slice(2)
    sl.heartbeat_timeout = 0  # the liveness watch would end it: here it stays frozen
    pid = sl.session.hosts[1].info["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T", 10, "it to stop")
        stacks = sl.stacks()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert stacks[1].state == "stopped" and "stopped" in stacks[1].error
    assert stacks[0].where.startswith("not in a cell")
    lines = stacks.text().splitlines()
    assert lines[1] == "[0] main thread: not in a cell (waiting for the next one)"
    assert lines[2].startswith("[1] its process is stopped")


def test_the_reader_says_py_spy_is_missing_and_keeps_the_python_stacks(tmp_path):
    """The reader program a remote host runs, on a host environment without py-spy: one reason,
    and the Python stacks still come."""
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = subprocess.Popen([sys.executable, "-c", "import sys\nsys.path.insert(0, sys.argv[1])\n"
                               "from tpunb.host import stacks\nimport json, time\n"
                               "print(json.dumps(stacks.install()), flush=True)\n"
                               "def resting():\n    time.sleep(600)\nresting()", str(ROOT)],
                              stdout=subprocess.PIPE, text=True)
    try:
        at = json.loads(target.stdout.readline())
        request = {"pid": target.pid, "signal": at["signal"], "path": at["path"], "native": True}
        body = json.dumps({"source": stacks_source(), "request": request}).encode()
        done = subprocess.run([str(venv / "bin" / "python"), "-S", "-c", STACKS_READER],
                              input=b"%012d" % len(body) + body, capture_output=True, timeout=60,
                              env={"PATH": str(venv / "bin")})
    finally:
        target.kill()
        target.wait()
    reply = json.loads(done.stdout[12:])
    assert reply["native"]["missing"]
    host = from_reply(3, reply, at["main"])
    assert "py-spy is not installed" in host.native_error
    assert host.main.where == "<string>:7 resting"  # a -c program's function: the user's own code
    text = Stacks("s", {3: host}, 0.01).text()
    assert "[3] main thread: <string>:7 resting" in text
    assert text.splitlines()[-1].startswith("[tpunb] no native frames from host 3: py-spy is not installed")


def test_identical_stacks_group_with_host_ranges():
    dump = ('Thread 0x00007f0000000002 (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 327 in wait\n'
            '  File "<tpunb:tpunb_host.inbox>", line 40 in run\n\n'
            'Current thread 0x00007f0000000001 (most recent call first):\n'
            '  File "/v/site-packages/jax/_src/lax/parallel.py", line {line} in psum\n'
            '  File "/home/me/train.py", line 42 in step\n'
            '  File "<ipython-input-3-abc123>", line 5 in <module>\n'
            '  File "/v/site-packages/IPython/core/interactiveshell.py", line 3577 in run_code\n'
            '  File "<tpunb:tpunb_host.agent>", line 300 in op_exec\n'
            '  File "<string>", line 17 in <module>\n')
    hosts = {h: HostStacks(h, parse_faulthandler(dump.format(line=88 if h == 7 else 120), 0x7f0000000001))
             for h in range(8)}
    hosts[8] = HostStacks(8, error="its process is gone", state="gone")
    text = Stacks("pod", hosts, 0.012).text(frames=False).splitlines()
    assert text == ["[tpunb] stacks of 'pod' (9 hosts, read in 12 ms)",
                    "[0-6] main thread: In[3]:5 <module> -> train.py:42 step -> psum",
                    "[7] main thread: In[3]:5 <module> -> train.py:42 step -> psum",
                    "[8] its process is gone"]
    frames = hosts[0].main.frames  # the user's frames first, the library's after; IPython's and ours gone
    assert [f.kind for f in frames] == ["user", "user", "library"]
    assert [t.main for t in hosts[0].threads] == [True]  # tpunb's inbox thread is not shown


def test_a_second_dump_in_the_same_text_is_left_out():
    one = 'Current thread 0x0000000000000001 (most recent call first):\n  File "/a/b.py", line 3 in f\n'
    threads = parse_faulthandler(one + "\n" + one.replace("line 3", "line 9"), 1)
    assert len(threads) == 1 and threads[0].frames[0].line == 3


def test_a_dump_is_read_whole_from_outside_the_process():
    target = subprocess.Popen([sys.executable, "-c", "import sys\nsys.path.insert(0, sys.argv[1])\n"
                               "from tpunb.host import stacks\nimport json, threading\n"
                               "for _ in range(40):\n    threading.Thread(target=threading.Event().wait, daemon=True).start()\n"
                               "print(json.dumps(stacks.install()), flush=True)\nsys.stdin.read()", str(ROOT)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        at = json.loads(target.stdout.readline())
        first = host_stacks.dump(target.pid, at["signal"], at["path"])
        second = host_stacks.dump(target.pid, at["signal"], at["path"])  # only what the second signal wrote
    finally:
        target.kill()
        target.wait()
    for reply in (first, second):
        threads = parse_faulthandler(reply["text"], at["main"])
        assert len(threads) == 41 and threads[0].main
    assert host_stacks.dump(target.pid, at["signal"], at["path"])["state"] == "gone"


def _settled(stacks: Stacks) -> Stacks | None:
    """The stacks once host 0 is in its read and host 1 in its regex (they may still be on their way)."""
    where = stacks.where()
    return stacks if where[0].endswith("waiting") and where[1].endswith("match") else None


@pytest.mark.fresh_slice
def test_bad_input_is_one_line(cell):
    from tpunb import manager
    from tpunb.errors import TpunbError

    assert "no slice yet: launch one" in str(cell("%tpu_stacks").error)
    manager.launch("v4-8", name="one")
    for line, said in (("%tpu_stacks --hosts 5", "host 5"), ("%tpu_stacks --bogus", "Usage: %tpu_stacks"),
                       ("%tpu_restart --hosts x", "--hosts"), ("%tpu_restart now", "Usage: %tpu_restart"),
                       ("%tpu_stacks --slice nope", "no slice named 'nope'")):
        run = cell(line)
        assert isinstance(run.error, TpunbError) and said in str(run.error), (line, run.shown)
        assert "Traceback" not in run.shown and len(str(run.error).splitlines()) == 1


@pytest.mark.fresh_slice
def test_stacks_of_a_slice_another_kernel_holds(cell):
    """%tpu_stacks --slice NAME in a second notebook: read through the registry, never attached here."""
    code = ("import sys, tpunb; sl = tpunb.launch('v4-16', name='theirs'); "
            "sl.run('import time\\ndef training():\\n    time.sleep(600)\\ntraining()', background=True); "
            "print('READY', flush=True); sys.stdin.read()")
    other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(lambda: other.stdout.readline().startswith("READY"), 120, "the other kernel's slice")
        shown = wait_for(lambda: (lambda out: out if "training" in out else None)(
            cell("%tpu_stacks --slice theirs").stdout), 60, "its hosts inside training()")
        assert re.search(r"^\[0-1\] main thread: In\[\d+\]:4 <module> -> In\[\d+\]:3 training$", shown, re.M), shown
        from tpunb import manager
        assert manager.attached("theirs") is None
    finally:
        other.kill()
        other.wait()
