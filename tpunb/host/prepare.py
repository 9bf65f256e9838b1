"""Make the host's Python environment before the agent starts: a virtual environment made with uv,
with the Python and packages the kernel asks for, on a fresh TPU VM image that has neither.

Google's TPU VM images are Ubuntu 22.04 with Python 3.10 and no framework (cloud.google.com/tpu/
docs/runtimes: pick the image, "then install the framework"). So on a cloud slice the agent's
start goes through here first: the kernel spawns the host's bare ``python3`` with ``LAUNCHER``
(tpunb/transport/bundle.py), which reads the spec and the agent bundle, calls ``launch``, and that
execs the environment's Python with the agent. A host whose environment is already right (a
reconnect, a kernel restart, a kept disk) costs one file read here, no round trip.

Steps, each said to the kernel as a ``prepare`` frame (one progress bar shows every host's):
uv (pip-installed into the user's site when absent; where the image's Python has no pip, PyPI's
wheel, its sha256 checked: uv_wheel.py), the Python (``uv python install X.Y``), the venv, the
packages (``uv pip install --no-build``: wheels only, never a compiler on a TPU VM), then the
versions, recorded in the environment's ``tpunb-env.json``. A failure is one line that names the
cause (a package that does not exist, a version with no wheel for this Python, no route to the
package index, a Python uv cannot provide), sent as the last frame.

Shipped to hosts: standard library only, and it must run on the image's Python 3.10.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import importlib.util
import json
import os
import re
import select
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import threading
import time
from typing import Iterator

from . import protocol, uv_wheel

#: where the environment lives on each host (one per user: a kept disk keeps it)
DEFAULT_DIR = "~/.tpunb/env"
MARKER = "tpunb-env.json"
#: the steps a host goes through, in order (the progress bar counts them)
STEPS = ("uv", "python", "venv", "packages", "versions")
#: a frame at least this often while a step runs: the kernel counts it as a sign of life
BEAT_SECONDS = 1.0
#: where a TPU shows itself as JAX looks for it (jax/_src/hardware_utils.py): a PCI device of
#: Google's vendor id with a TPU's device id (Google's gVNIC shares the vendor id). Device files
#: under /dev differ by generation (accel*, vfio/N) and by image.
PCI_DEVICES = "/sys/bus/pci/devices"
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICE_IDS = {"0x0027": "v2/v3", "0x0056": "plc", "0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e",
                      "0x006f": "v6e", "0x0076": "tpu7x"}
#: libtpu for jax 0.5.0 and older is a libtpu-nightly wheel that only JAX's own index has
LIBTPU_FIND_LINKS = "https://storage.googleapis.com/jax-releases/libtpu_releases.html"


class SetupError(Exception):
    """One line that says why this host's environment could not be made."""


def launch(spec: dict, read, bootstrap: str, init: dict | None = None) -> None:
    """Prepare as ``spec`` says, then replace this process by the environment's Python running the
    agent (``bootstrap``, reading the bundle this reads from stdin now, and ``init``, through a
    memfd: stdin stays empty until the agent's hello, so its end means "stop")."""
    bundle = read(int(read(12)))
    out = os.dup(1)
    say = _Sayer(out)
    watch = _watch_stdin()
    try:
        info = ensure(spec, say)
    except SetupError as exc:
        say({"op": "prepare", "state": "failed", "error": str(exc)})
        os._exit(1)
    except BaseException as exc:  # a bug here must still end in one line, never a hang
        say({"op": "prepare", "state": "failed", "error": f"{type(exc).__name__}: {exc}"})
        os._exit(1)
    watch.set()
    say({"op": "prepare", "state": "ready", **info})
    os.close(out)
    fd = os.memfd_create("tpunb-agent-bundle", 0)  # no file left behind, whatever happens next
    init_json = json.dumps(init).encode()
    os.write(fd, b"%012d" % len(bundle) + bundle + b"%012d" % len(init_json) + init_json)
    os.lseek(fd, 0, os.SEEK_SET)
    python = info["python"]
    activate(os.path.dirname(os.path.dirname(python)))
    os.execv(python, [python, "-c", bootstrap, str(fd)])


def activate(env_dir: str) -> None:
    """What ``source bin/activate`` does, for this process and what it starts (shell commands)."""
    os.environ["VIRTUAL_ENV"] = env_dir
    bindir = os.path.join(env_dir, "bin")
    path = os.environ.get("PATH", "").split(os.pathsep)
    os.environ["PATH"] = os.pathsep.join([bindir] + [p for p in path if p and p != bindir])
    os.environ.pop("PYTHONHOME", None)


class _Sayer:
    """Frames to the kernel on the original stdout, from any thread."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()

    def __call__(self, message: dict) -> None:
        data = protocol.encode(message)
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]


def _watch_stdin() -> threading.Event:
    """The kernel closes our stdin to stop us (Ctrl-C, the node deleted): end this process group at
    once, uv and pip with it. Nothing else arrives on stdin before the agent's hello."""
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            ready, _, _ = select.select([0], [], [], 0.2)
            if ready and not done.is_set():
                try:
                    os.killpg(os.getpgid(0), signal.SIGKILL)
                finally:
                    os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    return done


def has_tpu(root: str = PCI_DEVICES) -> bool:
    """Whether this machine has a TPU chip, decided as JAX decides it: a PCI device of Google's
    vendor and a TPU's device id (a TPU VM gets jax[tpu] and libtpu; any other host plain jax)."""
    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read().strip().lower()
        except OSError:
            return ""

    return any(read(os.path.join(device, "vendor")) == GOOGLE_PCI_VENDOR
               and read(os.path.join(device, "device")) in TPU_PCI_DEVICE_IDS
               for device in glob.glob(os.path.join(root, "*")))


def digest(spec: dict, tpu: bool | None = None) -> str:
    """What the environment was made from (same digest: nothing to do). Whether the host has a TPU
    is part of it: an environment made without libtpu is made again once chips are found."""
    wanted = {k: spec.get(k) for k in ("python", "jax", "jax_pinned", "jax_python", "packages", "pip", "requirements")}
    wanted["tpu"] = has_tpu() if tpu is None else tpu
    if spec.get("libtpu"):  # only where asked: environments made before it keep their digest
        wanted["libtpu"] = spec["libtpu"]
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]


def ensure(spec: dict, say) -> dict:
    """The environment ``spec`` asks for, made or checked; its python, path and versions. Under a
    lock: a second kernel attaching at the same time waits, then finds it made, not made twice."""
    env_dir = os.path.expanduser(spec.get("dir") or DEFAULT_DIR)
    with _env_lock(env_dir, say):
        return _ensure(spec, say, env_dir)


@contextlib.contextmanager
def _env_lock(env_dir: str, say) -> Iterator[None]:
    """An exclusive lock beside the environment, held while it is checked and made; while another
    process holds it, beats say so (the kernel counts frames as signs of life)."""
    os.makedirs(os.path.dirname(env_dir.rstrip("/")) or ".", exist_ok=True)
    fd = os.open(env_dir.rstrip("/") + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        step = _Steps(say)
        step.current = STEPS[0]
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                step.note("another process is preparing this environment: waiting", force=False)
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _ensure(spec: dict, say, env_dir: str) -> dict:
    python = os.path.join(env_dir, "bin", "python")
    want = digest(spec)
    recorded = _read_marker(env_dir)
    if recorded.get("digest") == want and os.access(python, os.X_OK):
        return {"python": python, "env": env_dir, "versions": recorded.get("versions") or {}, "fresh": False}
    step = _Steps(say)
    uv = step.run("uv", lambda: find_uv(step))
    request = step.run("python", lambda: python_request(uv, str(spec["python"]), step))
    same_python = recorded.get("python_request") == request and os.access(python, os.X_OK)
    step.run("venv", lambda: None if same_python else make_venv(uv, request, env_dir, step))
    version = _python_version(python)
    requirements = step.run("packages", lambda: install(uv, python, spec, version, env_dir, step))
    versions = step.run("versions", lambda: installed(env_dir))
    versions["python"] = ".".join(map(str, version))
    with open(os.path.join(env_dir, MARKER), "w") as f:
        json.dump({"digest": want, "python_request": request, "requirements": requirements, "versions": versions,
                   "made": time.time(), "seconds": step.seconds}, f, indent=1)
    return {"python": python, "env": env_dir, "versions": versions, "fresh": True, "seconds": step.seconds}


def _read_marker(env_dir: str) -> dict:
    try:
        with open(os.path.join(env_dir, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


#: the idle watchdog's state and activity files (standalone/idle.py STATE, ACTIVITY; not shipped
#: with the launcher, so named here, and a test holds the two equal)
IDLE_FILES = ("idle.json", "activity")


def touch_idle_activity() -> None:
    """A first environment build can outlast the boot watchdog's grace for the launching kernel:
    while steps run, mark activity as an attached agent would (only where a watchdog is armed)."""
    folder = os.environ.get("TPUNB_HOST_DIR") or "/var/tmp/tpunb-host"
    state, activity = (os.path.join(folder, name) for name in IDLE_FILES)
    if os.path.exists(state):
        try:
            os.utime(activity, None)
        except OSError:
            pass  # not marked yet, or not ours to touch: the watchdog keeps its own clock


class _Steps:
    """Says each step as it starts, beats while it runs, and what it printed last."""

    def __init__(self, say) -> None:
        self.say = say
        self.current = ""
        self.last = 0.0
        self.seconds: dict = {}  # step -> how long it took

    def run(self, name: str, action):
        self.current = name
        self.note("")
        started = time.monotonic()
        try:
            return action()
        finally:
            self.seconds[name] = round(time.monotonic() - started, 3)

    def note(self, text: str, force: bool = True) -> None:
        now = time.monotonic()
        if force or now - self.last >= BEAT_SECONDS:
            self.last = now
            touch_idle_activity()
            self.say({"op": "prepare", "state": "step", "step": self.current, "index": STEPS.index(self.current),
                      "note": text[:60]})


def command(argv: list, step: _Steps, what: str, python: str | None = None) -> str:
    """Run ``argv``, saying its latest line (and beating) while it runs; its output, or SetupError
    with the one line that says why it failed."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=os.environ)
    lines: list = []

    def read() -> None:
        for raw in iter(proc.stdout.readline, b""):
            lines.append(raw.decode(errors="replace").rstrip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while proc.poll() is None:
        reader.join(BEAT_SECONDS)
        step.note(next((line.strip() for line in reversed(lines) if _news(line)), ""), force=False)
    reader.join()
    text = "\n".join(lines)
    if proc.returncode != 0:
        raise SetupError(explain(text, what, python))
    return text


def _news(line: str) -> bool:
    """A line of uv's worth showing in the progress bar (what it resolved, fetched, installed)."""
    return line.strip().startswith(("Resolved", "Prepared", "Installed", "Downloading", "Downloaded", "Audited"))


def explain(text: str, what: str, python: str | None = None) -> str:
    """uv's or pip's failure as one line that names the cause (``python``: the environment's X.Y)."""
    found = re.search(r"Because (\S+?) was not found in the package registry", text)
    if found:
        return f"package {found.group(1)} does not exist on the package index ({what}): check its name"
    found = re.search(r"Because (\S+?) has no (?:usable wheels|wheels with a matching)", text)
    if found:
        return (f"{found.group(1)} has no wheel for this host's Python {python or _short(sys.version_info)} "
                f"({what}): pick a version that has one (or another --python)")
    found = re.search(r"No download found for request: (\S+)", text)
    if found:
        return f"uv cannot provide Python {found.group(1)} ({what}): no build of it exists to download"
    offline = re.search(r"(Connection refused|tcp connect error|dns error|Name or service not known|Failed to "
                        r"establish a new connection|Network is unreachable|timed out|No route to host)", text)
    if offline:
        url = re.search(r"(https?://[^\s/]+)", text)
        where = f" ({url.group(1)})" if url else ""
        return (f"no route to the package index{where} ({what}: {offline.group(1).lower()}): check the host's "
                "network and its pip/uv index settings")
    if "Could not find a version that satisfies" in text or "No matching distribution" in text:
        return f"no route to the package index ({what}: pip found no uv there): check the host's network and index settings"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if line.lower().startswith(("error:", "cause:", "caused by:"))]
    if said:  # uv's own words: what failed, then its first cause
        parts = [said[0].split(":", 1)[1].strip()] + [line.split(":", 1)[1].strip() for line in said[1:2]]
        return f"{what} failed: {': '.join(p for p in parts if p)}"
    meaningful = [line for line in lines if not line.startswith(("hint", "WARNING", "Using Python"))]
    return f"{what} failed: {meaningful[-1] if meaningful else 'no output'}"


def _short(version) -> str:
    return f"{version[0]}.{version[1]}"


def find_uv(step: _Steps) -> str:
    """uv on PATH or in the user's site, else pip-installed there (on a real VM, from PyPI); an
    image whose Python has no pip gets PyPI's uv wheel, checked and unpacked (uv_wheel.py)."""
    user_bin = os.path.join(site.getuserbase(), "bin", "uv")
    beside = os.path.join(sysconfig.get_path("scripts"), "uv")  # uv pip-installed into this Python itself
    for candidate in (shutil.which("uv"), user_bin, beside):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    if importlib.util.find_spec("pip") is None:  # Ubuntu's cloud images lack python3-pip
        return bootstrap_uv(os.path.dirname(user_bin), step)
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    user = () if in_venv else ("--user",)
    if not in_venv and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")):
        user += ("--break-system-packages",)  # PEP 668 images (Ubuntu 24.04): a user install harms nothing
    command([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *user, "uv"], step,
            "pip install uv")
    located = shutil.which("uv") if in_venv else user_bin
    if (not located or not os.access(located, os.X_OK)) and os.access(beside, os.X_OK):
        located = beside  # pip found uv already installed in this Python (not in the user's site)
    if not located or not os.access(located, os.X_OK):
        raise SetupError(f"pip installed uv, but it is not at {user_bin}")
    return located


def bootstrap_uv(bin_dir: str, step: _Steps) -> str:
    """uv from PyPI's wheel with the standard library alone (uv_wheel.py); its failures as one line."""
    try:
        return uv_wheel.install(bin_dir, lambda text: step.note(text, force=False))
    except uv_wheel.Unreachable as exc:
        raise SetupError(explain(str(exc), f"uv {uv_wheel.UV_VERSION} from PyPI (this Python has no pip)")) from None
    except uv_wheel.BadWheel as exc:
        raise SetupError(f"uv {uv_wheel.UV_VERSION} from PyPI (this Python has no pip): {exc}") from None


def python_request(uv: str, python: str, step: _Steps) -> str:
    """The ``--python`` for uv: an interpreter path as given, or version X.Y after
    ``uv python install X.Y`` (uv's managed builds; nothing to do when one is installed)."""
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", python):
        if not (shutil.which(python) or os.access(os.path.expanduser(python), os.X_OK)):
            raise SetupError(f"no Python {python} on this host (--python): give an X.Y version or an interpreter's path")
        return shutil.which(python) or os.path.expanduser(python)
    command([uv, "python", "install", python], step, f"uv python install {python}")
    return python


def make_venv(uv: str, request: str, env_dir: str, step: _Steps) -> None:
    shutil.rmtree(env_dir, ignore_errors=True)
    os.makedirs(os.path.dirname(env_dir), exist_ok=True)
    managed = ["--managed-python"] if re.fullmatch(r"\d+\.\d+(\.\d+)?", request) else []
    command([uv, "venv", "--quiet", *managed, "--python", request, env_dir], step, f"uv venv --python {request}")


def _python_version(python: str) -> tuple:
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True, text=True)
    return tuple(int(p) for p in out.stdout.split()) if out.returncode == 0 else sys.version_info[:3]


def jax_requirement(spec: dict, version: tuple, tpu: bool | None = None) -> list:
    """jax[tpu] on a TPU VM (libtpu and requests come with it; ``libtpu``: at least that one), plain
    jax and requests elsewhere (the sandbox: no chips to find); at the kernel's version when this
    Python can have it."""
    tpu = has_tpu() if tpu is None else tpu
    name = "jax[tpu]" if tpu else "jax"
    pinned = spec.get("jax")
    if pinned and (spec.get("jax_pinned") or satisfies(version, spec.get("jax_python") or "")):
        name += f"=={pinned}"
    if tpu and spec.get("libtpu"):  # the generation's minimum: within jax[tpu]'s own pin, at least this
        return [name, f"libtpu>={spec['libtpu']}"]
    return [name] if tpu else [name, "requests"]


def satisfies(version: tuple, specifier: str) -> bool:
    """``version`` meets a Requires-Python such as '>=3.11' or '>=3.9,<3.13' (simple clauses only)."""
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        found = re.fullmatch(r"(>=|<=|==|!=|>|<|~=)\s*(\d+(?:\.\d+)*)(\.\*)?", clause)
        if not found:
            continue
        op, bound = found.group(1), tuple(int(p) for p in found.group(2).split("."))
        mine = tuple(version[:len(bound)])
        ok = {">=": mine >= bound, "<=": mine <= bound, ">": mine > bound, "<": mine < bound,
              "==": mine == bound, "!=": mine != bound, "~=": mine >= bound}[op]
        if not ok:
            return False
    return True


def index_options(requirements: list) -> list:
    """uv's extra index options: JAX's libtpu page when jax[tpu] is pinned at 0.5.0 or older (its
    libtpu-nightly is not on PyPI, so the install would fail with no such distribution)."""
    for requirement in requirements:
        found = re.fullmatch(r"jax\[tpu\]==(\d+)\.(\d+)\.(\d+)\S*", requirement)
        if found and tuple(int(p) for p in found.groups()) <= (0, 5, 0):
            return ["--find-links", LIBTPU_FIND_LINKS]
    return []


def install(uv: str, python: str, spec: dict, version: tuple, env_dir: str, step: _Steps) -> list:
    requirements = jax_requirement(spec, version) + list(spec.get("packages") or ()) + list(spec.get("pip") or ())
    argv = [uv, "pip", "install", "--python", python, "--no-build", *index_options(requirements), *requirements]
    if spec.get("requirements"):
        path = os.path.join(env_dir, "tpunb-requirements.txt")
        with open(path, "w") as f:
            f.write(spec["requirements"])
        argv += ["-r", path]
    extra = " ".join(spec.get("pip") or ())
    command(argv, step, "uv pip install" + (f" --pip {extra}" if extra else ""), _short(version))
    return requirements


def installed(env_dir: str) -> dict:
    """{distribution: version} of the environment, from its dist-info folders (no interpreter run)."""
    found = {}
    for path in glob.glob(os.path.join(env_dir, "lib", "python*", "site-packages", "*.dist-info")):
        name, _, rest = os.path.basename(path)[:-len(".dist-info")].partition("-")
        found[name.lower().replace("_", "-")] = rest
    return found
