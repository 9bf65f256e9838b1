"""Idle autodelete on the slice: a watchdog on worker 0 deletes the node when nobody uses it.

STANDARD LIBRARY ONLY, and no relative imports: this file is shipped with the agent *and* is,
unchanged, the node's ``startup-script`` (a Python script), and the watchdog process itself.

Why on the slice: a laptop that sleeps or a kernel killed mid-launch must not leave a node
billing. The node is created with metadata ``tpunb-idle`` (JSON: seconds, node, api, delete,
grace, launch...) and this file as its startup script, so worker 0 arms the watchdog at boot even
if no kernel ever attaches (giving the launching kernel ``grace`` seconds to attach). Host 0's
agent arms it too as a kernel attaches, and marks activity for every request the kernel sends.

Files, in the host dir (``$TPUNB_HOST_DIR``, else ``/var/tmp/tpunb-host``, shared by root's boot
and the SSH user's agent; no secrets): ``idle.json`` the armed configuration; ``activity`` (its
mtime the last activity, its content the pid of an agent running a request; world-writable);
``idle.lock`` held by the running watchdog; ``idle.arm.lock`` held while one arms; ``idle.log``
what it did (never the token); ``serving/PID`` a live service supervisor (service.py): the node is
in use; ``attached`` a kernel said its launch is done (grace-only, below). A supervisor on another
worker writes the time as its guest attribute ``tpunb/serving`` while it runs: before it deletes,
the watchdog reads the workers' attributes (the TPU API sees them all) and counts the latest as use.

Which API made the slice is not this file's business: the gcp backend's handler that made it
describes every call in the configuration, as data (``provision/gcp/tpu/spec.py``,
``provision/gcp/compute/bodies.py``): ``api`` the API's root (with its version), ``delete`` what to
DELETE (a node, its queued resource, a MIG or an instance), ``after`` what to delete after it while
this VM lives (a MIG's template and policy cannot go while it exists, and its end ends this VM; the
next survey deletes the rest), ``permissions`` what those deletes need, ``launch`` the launch token
the slice must carry before it is deleted (never another notebook's slice of the name), and
``attributes`` how to read the workers' guest attributes: ``all``, one call that answers for every
worker in worker order, or ``members`` (a list of the slice's VMs) and ``member`` (each VM's own
call, ``{name}`` in it). Worker 0 is ``worker-id`` (or ``TPU_WORKER_ID`` in ``tpu-env``; no
``agent-worker-number`` there), a single instance worker 0. A slice armed without idle autodelete is
grace-only (``seconds`` 0): it goes unless a kernel says its launch is done (``launched``) within
``grace`` of the boot or of the last activity.

The access token comes from the metadata server (``$GCE_METADATA_HOST``, else
metadata.google.internal) on every delete attempt and stays in memory. At arming it asks Cloud
Resource Manager's ``testIamPermissions``, with that token, for every permission its deletes need,
and writes the answer as worker 0's guest attribute ``tpunb/idle-error`` (empty: it can; else why
not, e.g. "403: ... lacks tpu.nodes.delete"), as does a failed delete: %tpu_status shows it.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

STATE, ACTIVITY, LOCK, LOG, SCRIPT = "idle.json", "activity", "idle.lock", "idle.log", "idle_watchdog.py"
ATTACHED = "attached"  # a kernel said its launch (or attach) is done: a grace-only watchdog ends
ARM_LOCK = "idle.arm.lock"  # held while one arms: the boot and an agent may arm at the same moment
SERVING = "serving"
METADATA_ATTRIBUTE = "tpunb-idle"
SERVING_ATTRIBUTE = "tpunb/serving"  # a worker's guest attribute: when its services last ran (service.py)
ERROR_ATTRIBUTE = "tpunb/idle-error"  # worker 0's guest attribute: why the watchdog cannot delete ("": it can)
ERROR = "idle.error"  # the same, in the host dir
IAM_ENDPOINT = "https://cloudresourcemanager.googleapis.com"
CHECK_TIMEOUT = 5.0  # the permission check at arming: an API out of reach must not hold up a connect
POLL = 5.0  # the watchdog looks at least this often (activity only moves the deadline later)
RETRY = (15.0, 300.0)  # after a failed delete: first wait, doubling up to the last


def host_dir() -> str:
    path = os.environ.get("TPUNB_HOST_DIR") or "/var/tmp/tpunb-host"
    os.makedirs(path, exist_ok=True)
    try:
        os.chmod(path, 0o1777)  # root's boot and the SSH user's agent share it, like /tmp
    except OSError:
        pass
    return path


def _path(name: str) -> str:
    return os.path.join(host_dir(), name)


def log(text: str) -> None:
    try:
        with open(_path(LOG), "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {text}\n")
    except OSError:
        pass


def read_state() -> dict | None:
    try:
        with open(_path(STATE), encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def grace_only(state: dict | None) -> bool:
    return state is not None and not float(state.get("seconds") or 0) and float(state.get("grace") or 0) > 0


def launched() -> None:
    """A kernel is done launching or attaching: a grace-only watchdog ends, and a boot not yet run
    does not arm one (a file: root's state is not the SSH user's to replace in the sticky dir)."""
    if not os.path.exists(_path(ATTACHED)):
        os.close(os.open(_path(ATTACHED), os.O_WRONLY | os.O_CREAT, 0o644))


def touch(busy: bool = False) -> bool:
    """Record activity now (``busy``: this process runs a request). False when not armed here."""
    if read_state() is None:
        return False
    _mark(busy)
    return True


def _mark(busy: bool) -> None:
    path = _path(ACTIVITY)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        try:
            os.fchmod(fd, 0o666)
        except OSError:
            pass  # root's file: already 0666
        if busy:
            os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    os.utime(path, None)


def last_activity() -> tuple[float, int | None]:
    """(time of the last activity, pid that is busy or None)."""
    path = _path(ACTIVITY)
    try:
        with open(path, encoding="utf-8") as f:
            content = f.read().strip()
        mtime = os.stat(path).st_mtime
    except OSError:
        return 0.0, None
    return mtime, int(content) if content.isdigit() else None


def _alive(pid: int) -> bool:
    """The busy agent still runs (TPU VMs are Linux: /proc; a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] != b"Z"


def supervisors() -> list[int]:
    """Pids of the service supervisors alive on this host (their marks in ``serving/``)."""
    try:
        names = os.listdir(_path(SERVING))
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit() and _alive(int(n)))


def watchdog_running() -> bool:
    """True if a watchdog holds the lock (checked by trying to take it)."""
    try:
        fd = os.open(_path(LOCK), os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return True  # someone else's lock file we cannot even open: theirs runs
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def arm(config: dict, source: str, attaching: bool = False) -> bool:
    """Arm (or re-arm) this host: write the configuration, mark activity now, make sure one
    watchdog runs; True if one was started. ``attaching``: a kernel's agent arms, and counts as busy
    until the kernel says its launch is done (its checks may outlast a short idle limit). The boot
    and an attaching agent may arm at once (sshd answers before startup scripts run): one at a time,
    the later only touches, else the boot's state (its grace) could replace the agent's."""
    guard = os.open(_path(ARM_LOCK), os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        return _arm(config, source, attaching)
    finally:
        os.close(guard)


def _arm(config: dict, source: str, attaching: bool) -> bool:
    running, armed = watchdog_running(), read_state()
    if running and armed is not None and armed.get("node") == config.get("node"):
        if attaching:  # a kernel attaches; a boot's arm after it (a race at boot) changes nothing
            touch(True)
        return False
    # not running, or running for another node (a disk that outlived its node): its state is replaced,
    # and a running watchdog reads it at its next look
    state = {k: config[k] for k in ("seconds", "node", "api", "iam_endpoint", "delete", "after", "permissions",
                                    "attributes", "grace", "launch") if k in config}
    _mark(attaching)
    state["armed_at"] = last_activity()[0]  # a later touch means a kernel attached (ends the grace)
    tmp = _path(f".{STATE}.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f)
    os.chmod(tmp, 0o644)
    os.replace(tmp, _path(STATE))
    script = _path(SCRIPT)
    tmp = f"{script}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(source)
    os.chmod(tmp, 0o755)
    os.replace(tmp, script)
    for _ in range(2):  # a second time if a watchdog that held the lock exited meanwhile (disarmed)
        _detached(script, "spawn", wait=True)  # takes the lock, starts the watchdog holding it, exits
        if watchdog_running():
            break
    log(f"armed: delete {state['node']} after {state['seconds']:g} s idle{' (grace-only)' * grace_only(state)}")
    say_problem(permission_problem(state))
    return not running


def _detached(script: str, mode: str, wait: bool = False, lock: int | None = None) -> None:
    """Run ``script mode`` in its own session, with only the environment it needs (no --env secrets);
    through ``spawn`` (which takes ``lock`` and hands it on) the watchdog descends from no agent or boot."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        proc = subprocess.Popen([sys.executable, script, mode] + ([] if lock is None else [str(lock)]),
                                stdin=devnull, stdout=devnull, stderr=devnull, start_new_session=True,
                                close_fds=True, pass_fds=() if lock is None else (lock,), cwd="/",
                                env={k: v for k, v in os.environ.items() if k in _KEEP_ENV})
    finally:
        os.close(devnull)
    if wait:
        proc.wait(timeout=60)


_KEEP_ENV = ("PATH", "HOME", "LANG", "TPUNB_HOST_DIR", "GCE_METADATA_HOST", "GCE_METADATA_IP", "HTTPS_PROXY",
             "https_proxy", "NO_PROXY", "no_proxy", "SSL_CERT_FILE")


# -- the cloud calls ------------------------------------------------------------------------

def metadata_host() -> str:
    """$GCE_METADATA_HOST or $GCE_METADATA_IP (google-auth reads both, JAX the second), else Google's."""
    return os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP") or "metadata.google.internal"


def metadata(path: str, timeout: float = 5.0, value: str | None = None) -> str:
    """One value from the GCE metadata server (``instance/attributes/...``); ``value``: PUT it instead."""
    request = urllib.request.Request(f"http://{metadata_host()}/computeMetadata/v1/{path}",
                                     headers={"Metadata-Flavor": "Google"}, method="GET" if value is None else "PUT",
                                     data=None if value is None else value.encode())
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


def _api(state: dict, method: str, path: str, body: dict | None = None) -> bytes:
    """One call to the slice's API (``api``: its root) with the VM's own credentials; raises HTTPError as urllib does."""
    token = json.loads(metadata("instance/service-accounts/default/token"))["access_token"]
    headers = {"Authorization": f"Bearer {token}", **({"Content-Type": "application/json"} if body is not None else {})}
    request = urllib.request.Request(f"{state['api'].rstrip('/')}/{path}", method=method,
                                     headers=headers, data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read()


def say_problem(problem: str | None) -> None:
    """Why it cannot delete the node (""/None: it can), once a change: ``idle.error``, ``tpunb/idle-error``."""
    text = problem or ""
    try:
        with open(_path(ERROR), encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    try:
        with open(_path(ERROR), "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(_path(ERROR), 0o666)
    except OSError:
        pass
    if text:
        log(f"cannot delete the node: {text}")
    try:
        metadata(f"instance/guest-attributes/{ERROR_ATTRIBUTE}", CHECK_TIMEOUT, text)
    except Exception as exc:  # guest attributes off, or no metadata server: the log says it
        log(f"cannot write guest attribute {ERROR_ATTRIBUTE} ({type(exc).__name__}: {exc})")


def permission_problem(state: dict) -> str | None:
    """Why the VM's service account cannot delete the node, or None: testIamPermissions with the VM's own token."""
    project = state["node"].split("/")[1]
    needed = list(state.get("permissions") or [])
    if not needed:
        return None
    endpoint = (state.get("iam_endpoint") or IAM_ENDPOINT).rstrip("/")
    try:
        token = json.loads(metadata("instance/service-accounts/default/token", CHECK_TIMEOUT))["access_token"]
        request = urllib.request.Request(f"{endpoint}/v1/projects/{project}:testIamPermissions", method="POST",
                                         data=json.dumps({"permissions": needed}).encode(),
                                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=CHECK_TIMEOUT) as response:
            held = set(json.loads(response.read() or b"{}").get("permissions") or [])
    except urllib.error.HTTPError as e:
        return f"{e.code} {_message(e)}"
    except Exception as exc:  # no route to Google's APIs (an --internal-ip node without Private Google Access)
        return f"cannot reach {endpoint.split('//')[-1]} ({type(exc).__name__}: {exc})"
    missing = [p for p in needed if p not in held]
    if not missing:
        return None
    try:
        account = metadata("instance/service-accounts/default/email", CHECK_TIMEOUT).strip()
    except Exception:
        account = "the VM's service account"
    return f"403 {account} lacks {', '.join(missing)} in project {project}"


def _message(error: urllib.error.HTTPError) -> str:
    """The API's own message from an HTTP error's JSON body, on one line."""
    body = error.read(2000).decode(errors="replace")
    try:
        body = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        pass
    return " ".join(str(body).split())[:300]


def ours(state: dict) -> bool:
    """The slice carries this watchdog's launch token (label, or ``launch=`` in its description);
    armed without one (the handler asked for no check), any slice of the name is."""
    if not state.get("launch"):
        return True
    try:
        found = json.loads(_api(state, "GET", state["node"]) or b"{}")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return True
        raise RuntimeError(f"HTTP {e.code} {_message(e)}") from None
    words = dict(w.split("=", 1) for w in str(found.get("description") or "").split() if "=" in w)
    return ((found.get("labels") or {}).get("tpunb-launch") or words.get("launch")) == state["launch"]


def delete_rest(state: dict, until: float) -> None:
    """What goes after the slice (``after``: a MIG's template, then its policy), tried while this VM
    lives (the MIG's end is its end)."""
    for path in state.get("after") or []:
        while time.time() < until:
            try:
                _api(state, "DELETE", path)
                break
            except Exception as e:  # 404: gone; else (in use until the MIG is gone) again
                if getattr(e, "code", None) == 404:
                    break
            time.sleep(2.0)


def delete_node(state: dict) -> str:
    """Delete the node with the VM's own credentials: 'deleted', 'gone' (404), 'not ours' or raise."""
    if not ours(state):
        return "not ours"  # another launch's slice holds the name now
    try:
        _api(state, "DELETE", state.get("delete") or state["node"])
        return "deleted"
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return "gone"
        raise RuntimeError(f"HTTP {e.code} {_message(e)}") from None


def _workers_attributes(state: dict) -> list[tuple[int | str, list[dict]]]:
    """Each worker's ``tpunb/`` guest attributes: (worker, items), as ``attributes`` says to read them:
    ``all``, one call that answers for every worker in worker order (a Cloud TPU node); or the slice's
    ``members`` listed, then each asked by ``member`` (named by VM: the list is not in worker order).
    Neither: a single VM, no other worker."""
    how = state.get("attributes") or {}
    if how.get("all"):
        answer = json.loads(_api(state, "POST", how["all"], {"queryPath": "tpunb/"}) or b"{}")
        return [(worker, (entry.get("queryValue") or {}).get("items") or [])
                for worker, entry in enumerate(answer.get("guestAttributes") or [])]
    if not how.get("members"):
        return []
    listed = json.loads(_api(state, "POST", how["members"]) or b"{}")
    found = []
    for vm in listed.get("managedInstances") or []:
        name = str(vm.get("instance") or vm.get("name") or "").rsplit("/", 1)[-1]
        try:
            answer = json.loads(_api(state, "GET", how["member"].format(name=name)) or b"{}")
        except urllib.error.HTTPError as e:
            if e.code == 404:  # no attribute under the path yet (or the VM just went)
                continue
            raise
        found.append((name, (answer.get("queryValue") or {}).get("items") or []))
    return found


def served_elsewhere(state: dict) -> tuple[float, int | str] | None:
    """(the latest time a worker's service said it ran, that worker), from the workers' guest
    attributes; None when none did. Raises when the API cannot be read."""
    latest = None
    for worker, items in _workers_attributes(state):
        for item in items:
            if (item.get("namespace"), item.get("key")) == tuple(SERVING_ATTRIBUTE.split("/")):
                try:
                    at = float(item.get("value") or "")
                except ValueError:
                    continue
                if latest is None or at > latest[0]:
                    latest = (at, worker)
    return latest


# -- the watchdog ---------------------------------------------------------------------------

def seconds_left(state: dict, now: float, busy_seen: float) -> float:
    """Until the node goes: ``seconds`` after the last sign of use (a touch, a request seen
    running, the arming), and, while no kernel has attached since the boot armed it, not before
    ``grace`` after the boot (the launching kernel's time to connect)."""
    armed_at = float(state.get("armed_at") or 0)
    last = max(last_activity()[0], busy_seen, armed_at)
    left = float(state["seconds"]) - (now - last)
    if last <= armed_at:
        left = max(left, armed_at + float(state.get("grace") or 0) - now)
    return left


def take_lock() -> int | None:
    """The watchdog's lock (an open fd that holds it), or None when a watchdog holds it."""
    lock = os.open(_path(LOCK), os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        return None
    return lock


def watch(lock: int | None = None) -> int:
    """The watchdog's loop; returns once the node was deleted or the host was disarmed.
    ``lock``: the lock, taken by the ``spawn`` step (else taken here)."""
    if lock is None and take_lock() is None:
        return 0  # another watchdog runs
    busy_seen, retry, kept, kept_serving, kept_elsewhere = 0.0, RETRY[0], None, [], None
    # when the use now going on began: "kept" is said once the node would have gone without it
    # (measured from busy_seen, refreshed on every look, the idle time would land on ~0 and be missed)
    use_began = busy_seen
    while True:
        state = read_state()
        seconds = float((state or {}).get("seconds") or 0)
        if grace_only(state):
            if os.path.exists(_path(ATTACHED)):
                log("a kernel said its launch is done: the grace-only watchdog exits")
                return 0
            left = _grace_left(state)
            if left > 0:
                time.sleep(max(0.05, min(POLL, left)))
                continue
            outcome, retry = _try_delete(state, retry)
            if outcome is not None:
                log(f"{outcome}: {state['node']}: no kernel said its launch was done within {state['grace']:g} s")
                return 0
            continue
        if state is None or seconds <= 0:
            log("disarmed: watchdog exits")
            return 0
        now = time.time()
        mark = last_activity()
        busy = mark[1]
        in_use = False
        if busy is not None and _alive(busy):
            if mark != kept and seconds_left(state, now, use_began) <= 0:  # once per request: why it stays
                log(f"kept: a request has run {seconds:g} s or more (agent pid {busy}); the idle time starts at its end")
                kept = mark
            in_use = True  # a request runs: that is activity for as long as it lasts
        serving = supervisors()
        if serving:
            if serving != kept_serving and seconds_left(state, now, use_began) <= 0:
                log(f"kept: a service runs (supervisor pids {', '.join(map(str, serving))}); "
                    "the idle time starts when the last one ends")
                kept_serving = serving
            in_use = True  # a running service is use, as a running request is
        if in_use:
            busy_seen = now
        else:
            use_began = busy_seen
        left = seconds_left(state, now, busy_seen)
        if left <= 0:
            elsewhere = _served_elsewhere(state, now)
            if elsewhere and seconds_left(state, now, max(busy_seen, elsewhere[0])) > 0:
                if elsewhere[1] != kept_elsewhere:
                    log(f"kept: a service runs on host {elsewhere[1]}; the idle time starts when the last one ends")
                    kept_elsewhere = elsewhere[1]
                busy_seen = max(busy_seen, elsewhere[0])
                continue
            kept_elsewhere = None
            outcome, retry = _try_delete(state, retry)
            if outcome is not None:
                log(f"{outcome}: {state['node']} after {seconds:g} s without activity")
                return 0
            continue
        time.sleep(max(0.05, min(left, POLL)))


def _try_delete(state: dict, retry: float) -> tuple[str | None, float]:
    """One delete (a MIG's template and policy after it): (outcome, next wait), None once a failure was said."""
    try:
        outcome = delete_node(state)
    except Exception as exc:  # the API or metadata server failed: say so, try again
        log(f"delete failed ({type(exc).__name__}: {exc}); retrying in {retry:g} s")
        say_problem(f"{str(exc).removeprefix('HTTP ')} (its delete failed)" if isinstance(exc, RuntimeError)
                    else f"its delete failed ({type(exc).__name__}: {exc})")
        time.sleep(retry)
        return None, min(retry * 2, RETRY[1])
    if outcome == "deleted":
        delete_rest(state, time.time() + 600.0)
    return outcome, RETRY[0]


def _grace_left(state: dict) -> float:
    """Grace-only: seconds until the slice goes (from the arming or the last activity); inf while a request runs."""
    mark = last_activity()
    if mark[1] is not None and _alive(mark[1]):
        return float("inf")
    return max(float(state.get("armed_at") or 0), mark[0]) + float(state.get("grace") or 0) - time.time()


def _served_elsewhere(state: dict, now: float) -> tuple[float, int | str] | None:
    """``served_elsewhere``, never later than ``now`` (another VM's clock), or None (and said
    in the log) when the API cannot be read: then host 0's own idle time decides."""
    try:
        found = served_elsewhere(state)
    except Exception as exc:
        log(f"cannot read the other hosts' services ({type(exc).__name__}: {exc}); deciding on host 0's use alone")
        return None
    return (min(found[0], now), found[1]) if found else None


def boot() -> int:
    """The startup-script path: on worker 0 of a node created with idle autodelete, arm."""
    try:
        config = json.loads(metadata(f"instance/attributes/{METADATA_ATTRIBUTE}"))
        worker = worker_id(config)
    except Exception as exc:  # no metadata server or no setting: nothing to arm
        print(f"tpunb idle autodelete: not armed ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 0
    if worker not in ("", "0") or not (float(config.get("seconds") or 0) > 0 or grace_only(config)):
        return 0
    if grace_only(config) and os.path.exists(_path(ATTACHED)):
        return 0  # a reboot of a slice a kernel took: its launch is long done
    with open(os.path.abspath(__file__), encoding="utf-8") as f:
        source = f.read()
    arm(config, source)
    return 0


def worker_id(config: dict) -> str:
    """This VM's worker number: a Cloud TPU VM's ``agent-worker-number``; a Compute Engine TPU VM's
    ``worker-id``, else ``TPU_WORKER_ID`` in ``tpu-env`` (they publish no agent-worker-number); a
    slice its handler armed as one VM (``single_vm``) is worker 0, another VM that says none ""."""
    for key in ("agent-worker-number", "worker-id"):
        try:
            return metadata(f"instance/attributes/{key}").strip()
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
    try:
        for line in metadata("instance/attributes/tpu-env").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "TPU_WORKER_ID":
                return value.strip().strip("'\"")
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
    return "0" if config.get("single_vm") else ""


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else "boot"
    if mode == "spawn":
        lock = take_lock()
        if lock is not None:  # else a watchdog runs already
            _detached(os.path.abspath(__file__), "watch", lock=lock)
        return 0
    if mode == "watch":
        return watch(int(argv[2]) if len(argv) > 2 else None)
    return boot()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
