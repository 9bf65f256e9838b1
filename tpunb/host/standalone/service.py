"""Services on a host: commands that outlive cells, the agent and the kernel.

The kernel runs this module as a short-lived control process (``bundle.SERVICE_CONTROL``, the module's
source and one request on stdin, one reply on stdout). ``start`` forks a supervisor into a
session of its own, so the watchdog that ends the agent's session with the kernel never reaches
it. The supervisor runs the command with its output appended to a log file, restarts it on
failure with a bounded back-off, and keeps a state file (pid, state, exit code, restarts) that a
later kernel's control process reads again. Environment values given by the kernel live only in
the supervisor's memory and the command's environment: never in a file. The variables the kernel
names as secrets (``secret_keys``: names only) are masked (``****``) in the log as it is written:
the command's output then passes through the supervisor (``MaskedLog``), so no value reaches the
host's disk, even one split across two writes, nor any form it takes in output.

``MaskedLog`` is ``log_mask.py``'s, which the kernel sends ahead of this file and runs in the same
namespace (``bundle.service_parts``): the kernel's own masker uses the same file. Shipped to hosts:
standard library only.
"""
from __future__ import annotations

import codecs
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

#: how long a stopped service's process group gets to end before it is killed
STOP_GRACE = 3.0
#: seconds a follow waits on the kernel's end of input between looks at the file it follows
FOLLOW_POLL = 0.1
#: states in which a supervisor is still at work
ACTIVE = ("starting", "running", "restarting")
#: the compile cache's variables (as tpunb/host/jax_start.py's, which this standalone program cannot import)
CACHE_VARIABLES = ("JAX_COMPILATION_CACHE_DIR", "VLLM_XLA_CACHE_PATH")
#: this worker's guest attribute that says when its services last ran (read by tpunb/host/standalone/idle.py)
SERVING_ATTRIBUTE = "tpunb/serving"
def frame(value: dict) -> bytes:
    """A length-prefixed JSON message, as the control process reads and writes them."""
    body = json.dumps(value).encode()
    return b"%012d" % len(body) + body


def control(request: dict) -> None:
    """Answer one request from the kernel on stdout (a frame), then exit."""
    if sys.prefix != sys.base_prefix:  # the environment tpunb made: services find its programs first
        os.environ["VIRTUAL_ENV"] = sys.prefix
        os.environ["PATH"] = os.path.join(sys.prefix, "bin") + os.pathsep + os.environ.get("PATH", "")
    try:
        reply = OPS[request["op"]](request)
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the kernel as one line
        reply = {"error": f"{type(exc).__name__}: {exc}"}
    if reply is not None:  # (a follow wrote its own frames)
        os.write(1, frame(reply))


# -- files ------------------------------------------------------------------------------------------
def _host_dir(request: dict) -> str:
    return os.path.join(os.path.expanduser(request["root"]), request["slice"], f"host-{request['host']}")


def _service_dir(request: dict, name: str | None = None) -> str:
    return os.path.join(_host_dir(request), name or request["name"])


def _read_state(directory: str) -> dict | None:
    try:
        with open(os.path.join(directory, "state.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_state(directory: str, state: dict) -> None:
    path = os.path.join(directory, "state.json")
    with open(path + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(path + ".tmp", path)


def alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped counts as ended)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not os.path.isdir("/proc")


def _current(directory: str) -> dict | None:
    """The state file, with a supervisor that vanished (host rebooted, killed) said as ``lost``."""
    state = _read_state(directory)
    if state and state.get("state") in ACTIVE and not alive(state.get("supervisor")):
        state["state"] = "lost"
    if state and state.get("state") == "running":  # answered a wait since this run started
        try:
            with open(os.path.join(directory, "ready")) as f:
                state["ready"] = f.read() == str(state.get("pid"))
        except OSError:
            pass
    return state


def tail_lines(path: str, lines: int) -> str:
    """The last ``lines`` lines of a file (read from its end: logs grow large)."""
    try:
        with open(path, "rb") as f:
            return _tail(f, lines, os.fstat(f.fileno()).st_size)
    except OSError:
        return ""


def _tail(f, lines: int, size: int) -> str:
    """The last ``lines`` lines of the first ``size`` bytes of the open file ``f``."""
    f.seek(max(0, size - 256 * (lines + 1) - 65536))
    text = f.read(size - f.tell()).decode(errors="replace")
    return "".join(text.splitlines(keepends=True)[-lines:]) if lines else ""


# -- operations -------------------------------------------------------------------------------------
def op_start(request: dict) -> dict:
    directory = _service_dir(request)
    state = _current(directory)
    if state and state.get("state") in ACTIVE:
        return {"error": f"service {request['name']!r} already runs (pid {state.get('pid')}): stop it first"}
    _touch_activity()  # starting a service is use, as a request is: the idle clock starts again
    os.makedirs(directory, exist_ok=True)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # leave the caller's session, then fork again so no terminal or parent holds us
        try:
            os.setsid()
            if os.fork() == 0:
                os.close(read_end)
                _supervise(request, directory, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    with os.fdopen(read_end, "rb") as f:
        said = f.read().decode()
    if not said:
        return {"error": f"the supervisor of {request['name']!r} did not start: see {directory}/log"}
    return {"state": json.loads(said), "log": os.path.join(directory, "log")}


def op_list(request: dict) -> dict:
    root = _host_dir(request)
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    return {"services": [s for s in (_current(os.path.join(root, n)) for n in names) if s]}


def _log_path(request: dict) -> tuple[str, str | None]:
    """(the path a logs or follow request reads, why it cannot): a service's log (``name``), or any
    file on the host (``file``, from the home directory)."""
    if request.get("file"):
        path = os.path.join(os.path.expanduser("~"), os.path.expanduser(request["file"]))
        return path, None if os.path.isfile(path) else f"no file {path} on this host"
    path = os.path.join(_service_dir(request), "log")
    return path, None if os.path.exists(path) else f"no service {request['name']!r} on this host"


def op_logs(request: dict) -> dict:
    """The log's last lines (``tail``), or all of it."""
    path, error = _log_path(request)
    if error:
        return {"error": error}
    tail = request.get("tail")
    if tail is None:
        with open(path, "rb") as f:
            data = f.read()
        return {"text": data.decode(errors="replace"), "offset": len(data)}
    return {"text": tail_lines(path, tail), "offset": os.path.getsize(path)}


def op_follow(request: dict) -> None:
    """The log's last ``tail`` lines as a first frame, then its bytes as they are written, a frame
    each, until the kernel closes this program's input (or its connection goes): it waits on that
    input, FOLLOW_POLL seconds at a time, between looks at the file."""
    path, error = _log_path(request)
    if error:
        os.write(1, frame({"error": error}))
        return None
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode  # a character split across reads
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            _write_all(frame({"text": _tail(f, request.get("tail") or 0, size), "pid": os.getpid()}))
            f.seek(size)  # what was written since the tail was read comes next, once
            while True:
                data = f.read(1 << 20)
                if data:
                    _write_all(frame({"text": decode(data)}))
                    continue
                if os.stat(path).st_size < f.tell():  # truncated (a log started afresh): from its start
                    f.seek(0)
                    continue
                if select.select([0], [], [], FOLLOW_POLL)[0] and not os.read(0, 4096):
                    return None  # the kernel stopped following
    except OSError:  # the kernel is gone (a broken pipe), or the file went
        return None


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def op_stop(request: dict) -> dict:
    """Stop one service (``name``) or every one of this slice on this host (``all``, then its files go)."""
    root = _host_dir(request)
    names = (sorted(os.listdir(root)) if os.path.isdir(root) else []) if request.get("all") else [request["name"]]
    stopped = []
    for name in names:
        directory = os.path.join(root, name)
        state = _read_state(directory)
        if state is None:
            if not request.get("all"):
                return {"error": f"no service {name!r} on this host"}
            continue
        _end(state)
        stopped.append(name)
    if request.get("all"):
        shutil.rmtree(root, ignore_errors=True)
    return {"stopped": stopped}


def _end(state: dict) -> None:
    """SIGTERM the supervisor (it ends its command's group) and wait; SIGKILL whatever is left."""
    supervisor, pgid = state.get("supervisor"), state.get("pid")
    if alive(supervisor):
        _signal(supervisor, signal.SIGTERM, group=False)
        _wait_gone(supervisor, STOP_GRACE + 2)
    for pid, group in ((pgid, True), (supervisor, False)):
        if pid and alive(pid):
            _signal(pid, signal.SIGKILL, group)
            _wait_gone(pid, 2)


def _signal(pid: int, sig: int, group: bool) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except OSError:
        pass


def _wait_gone(pid: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def op_wait(request: dict) -> dict:
    """Wait on this host until the service answers (a port accepts, or an HTTP path replies), it
    ends, or ``timeout`` passes; says which, with the log's last lines when it failed."""
    directory = _service_dir(request)
    deadline = time.monotonic() + request["timeout"]
    why = "no answer"
    while True:
        state = _current(directory) or {}
        if _answers(request["port"], request.get("path")):
            with open(os.path.join(directory, "ready"), "w") as f:  # status says ready (until a restart)
                f.write(str(state.get("pid")))
            return {"ready": True, "state": state}
        if state.get("state") not in ACTIVE:
            code = state.get("exit_code")
            why = f"it exited with code {code}" if code is not None else f"it is {state.get('state', 'gone')}"
            break
        if time.monotonic() > deadline:
            what = f"HTTP GET {request['path']}" if request.get("path") else "a connection"
            why = f"no answer to {what} on port {request['port']} within {request['timeout']:g} s"
            break
        time.sleep(0.1)
    return {"ready": False, "why": why, "tail": tail_lines(os.path.join(directory, "log"), request.get("tail", 20)),
            "state": state}


def _answers(port: int, path: str | None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            if not path:
                return True
            conn.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            return conn.recv(12).startswith(b"HTTP/")
    except OSError:
        return False


OPS = {"start": op_start, "list": op_list, "logs": op_logs, "follow": op_follow, "stop": op_stop, "wait": op_wait}


# -- the supervisor ---------------------------------------------------------------------------------
def _supervise(request: dict, directory: str, report_fd: int) -> None:
    """Run the command until it ends for good; restart it on failure when asked, with back-off."""
    for fd in range(3, 1024):  # hold nothing of the control process (its pipes to the kernel)
        if fd != report_fd:
            try:
                os.close(fd)
            except OSError:
                pass
    if hasattr(os, "sched_setscheduler"):  # local control processes run as batch work; a service need not
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass
    log = os.open(os.path.join(directory, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    env = {**os.environ, **request.get("env", {})}
    for key in CACHE_VARIABLES:  # the compile cache: the kernel says ~ for this host's home
        if env.get(key, "").startswith("~"):
            env[key] = os.path.expanduser(env[key])
    masked = MaskedLog(log, [env[k] for k in request.get("secret_keys", []) if k in env])  # noqa: F821 (log_mask.py)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stopping: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wake-up pipe hears the command end
    state = {"name": request["name"], "host": request["host"], "command": masked.text(request["command"]),
             "env_keys": request.get("env_keys", []), "restart": request.get("restart", "no"), "port": request.get("port"),
             "supervisor": os.getpid(), "pid": None, "state": "starting", "exit_code": None, "restarts": 0,
             "started_at": time.time(), "log": os.path.join(directory, "log"), "message": ""}
    max_restarts, backoff = int(request.get("max_restarts", 5)), float(request.get("backoff", 1.0))
    serving = _serving_mark()
    heartbeat = None if serving else _publish_serving()

    def say(line: str) -> None:
        masked.flush()
        os.write(log, f"[tpunb] {line}\n".encode())

    while True:
        try:
            child = subprocess.Popen(["/bin/sh", "-c", request["command"]], stdin=devnull, stdout=masked.out,
                                     stderr=masked.out,
                                     env=env, cwd=request.get("cwd") or None, start_new_session=True)
        except OSError as exc:
            say(f"cannot start the command: {exc}")
            state.update(state="exited", exit_code=127, message=str(exc))
            _write_state(directory, state)
            break
        state.update(pid=child.pid, state="running", exit_code=None)
        _write_state(directory, state)
        if report_fd is not None:
            os.write(report_fd, json.dumps(state).encode())
            os.close(report_fd)
            report_fd = None
        code = _wait_child(child, stopping, wake_r, masked)
        state["exit_code"] = code
        if stopping:
            state.update(state="stopped", message="stopped")
            say(f"stopped (exit code {code})")
            break
        if code == 0 or state["restart"] != "on-failure":
            state.update(state="exited", message=f"exited with code {code}")
            say(f"exited with code {code}")
            break
        if state["restarts"] >= max_restarts:
            state.update(state="failed", message=f"gave up after {max_restarts} restarts (last exit code {code})")
            say(state["message"])
            break
        delay = min(backoff * 2 ** state["restarts"], 30.0)
        state.update(state="restarting", restarts=state["restarts"] + 1,
                     message=f"exited with code {code}; restart {state['restarts'] + 1} of {max_restarts} in {delay:g} s")
        say(state["message"])
        _write_state(directory, state)
        until = time.monotonic() + delay
        while not stopping and time.monotonic() < until:  # the last run's SIGCHLD may wake a pause at once
            _pause(until - time.monotonic(), stopping, wake_r, masked)
        if stopping:
            state.update(state="stopped", message="stopped")
            break
    _write_state(directory, state)
    if serving:
        _end_serving(serving)
    if heartbeat:
        heartbeat()


def _serving_mark() -> str | None:
    """On a host whose node deletes itself when idle (``tpunb/host/standalone/idle.py`` armed in its host dir),
    a file named after this supervisor's pid in the host dir's ``serving`` folder: the watchdog
    counts a running service as use. The path, or None when nothing is armed here."""
    host_dir = os.environ.get("TPUNB_HOST_DIR") or "/var/tmp/tpunb-host"
    if not os.path.exists(os.path.join(host_dir, "idle.json")):
        return None
    folder = os.path.join(host_dir, "serving")
    try:
        os.makedirs(folder, exist_ok=True)
        os.chmod(folder, 0o1777)  # root's boot and the SSH user share the host dir
    except OSError:
        pass
    path = os.path.join(folder, str(os.getpid()))
    try:
        open(path, "w").close()
    except OSError:
        return None
    return path


def _end_serving(mark: str) -> None:
    """The service ended for good: its mark goes, and the host's activity is now (the idle time
    starts at the end of the last use, not at the watchdog's last look)."""
    try:
        os.unlink(mark)
    except OSError:
        pass
    _touch_activity()


def _touch_activity() -> None:
    """Activity now, for the idle watchdog (``tpunb/host/standalone/idle.py``), where one is armed."""
    host_dir = os.environ.get("TPUNB_HOST_DIR") or "/var/tmp/tpunb-host"
    if os.path.exists(os.path.join(host_dir, "idle.json")):
        try:
            os.utime(os.path.join(host_dir, "activity"), None)
        except OSError:
            pass


def _metadata(path: str, value: str | None = None) -> str:
    """GET (or, with ``value``, PUT) one path of the GCE metadata server."""
    import urllib.request  # only on a cloud VM: the kernel's masker imports this module too

    host = os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP") or "metadata.google.internal"
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"},
                                     method="GET" if value is None else "PUT",
                                     data=None if value is None else value.encode())
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.read().decode()


def _on_gce() -> bool:
    """A Google Compute Engine VM (a TPU VM) or our emulator's stand-in for one."""
    if os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP"):
        return True
    try:
        with open("/sys/class/dmi/id/product_name", encoding="utf-8") as f:
            return "Google" in f.read()
    except OSError:
        return False


def _publish_serving() -> Callable[[], None] | None:
    """On a worker of a node that deletes itself when idle, other than worker 0 (whose watchdog
    sees ``_serving_mark``): write the time as this worker's guest attribute every quarter of the
    idle limit, so worker 0's watchdog counts this service as use (tpunb/host/standalone/idle.py). Returns what
    to call at the service's end (one last write: the idle time starts then), or None."""
    if not _on_gce():
        return None
    try:
        seconds = float(json.loads(_metadata("instance/attributes/tpunb-idle")).get("seconds") or 0)
    except Exception:  # not a node with idle autodelete, or no metadata server: nothing to tell
        return None
    if seconds <= 0:
        return None
    done = threading.Event()

    def beat() -> None:
        while True:
            try:
                _metadata(f"instance/guest-attributes/{SERVING_ATTRIBUTE}", repr(time.time()))
            except Exception:
                pass  # the next beat tries again; worker 0 sees this worker's last good one age
            if done.wait(max(0.25, min(60.0, seconds / 4))):
                return

    thread = threading.Thread(target=beat, daemon=True, name="tpunb-serving")
    thread.start()

    def end() -> None:
        done.set()
        thread.join(timeout=10)
        try:
            _metadata(f"instance/guest-attributes/{SERVING_ATTRIBUTE}", repr(time.time()))
        except Exception:
            pass
    return end


def _wait_child(child: subprocess.Popen, stopping: list, wake_r: int, masked: MaskedLog) -> int:  # noqa: F821
    """Wait for the command; on SIGTERM end its group (SIGTERM, then SIGKILL after STOP_GRACE)."""
    killed_at = None
    while True:
        code = child.poll()
        if code is not None:
            masked.flush()
            return code
        if stopping and killed_at is None:
            killed_at = time.monotonic()
            _signal(child.pid, signal.SIGTERM, group=True)
        if killed_at is not None and time.monotonic() - killed_at > STOP_GRACE:
            _signal(child.pid, signal.SIGKILL, group=True)
        _pause(0.1, stopping, wake_r, masked)


def _pause(seconds: float, stopping: list, wake_r: int, masked: MaskedLog) -> None:  # noqa: F821
    """Sleep, but wake at once on a signal (SIGTERM: stop; SIGCHLD: the command ended), and copy
    the command's output to the log as it comes (when it is masked)."""
    if stopping and seconds > 0.1:
        return
    watched = [wake_r] + ([masked.read_end] if masked.read_end is not None else [])
    try:
        ready = select.select(watched, [], [], seconds)[0]
    except InterruptedError:
        return
    if wake_r in ready:
        os.read(wake_r, 512)
    if masked.read_end in ready:
        masked.drain()
