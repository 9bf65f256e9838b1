"""The agent: one long-lived process per host session that runs cells for tpunb.

Shipped to hosts: standard library only (see the package docstring). IPython, matplotlib and
jax are used only when the host has them, inside functions.

How it works: the session sends frames on our stdin (fd 0) and reads frames from a copy of our
original stdout. Fds 0/1/2 are then rewired (``io``), so user code, C libraries and subprocesses
write into pipes that a pump thread turns into ``stream`` frames. Cells run on the main thread
(``runners``), which also reads its requests between cells; while a cell runs, frames are read by
a thread (``inbox``) that delivers interrupts (SIGINT to the main thread) and starts JAX in the
background when another host of the slice started it (``jax_start``).
"""
from __future__ import annotations

import base64
import os
import signal
import socket
import sys
import threading
import time

from . import diagnose, jaxcache, preempt, protocol, stacks, watchdog
from .inbox import make_inbox
from .io import Channel, Flusher, NoStdin, OutputPump, quiet_thread
from .jax_start import JaxStarter, settle_cache
from .metrics import Sampler, install_log_shim
from .profiler import OPS as PROFILE_OPS, Profiler
from .exchange import ValueExchange
from .relay import OPS as RELAY_OPS, Relay
from .spread import OPS as FETCH_OPS, Fetches
from .runners import PlainRunner, cap_bundle, cap_text, flush_figures, make_ipython_runner, prefer_inline_matplotlib
from .standalone import idle

#: the compile cache's requests, answered beside cells
CACHE_OPS = ("cache_stats", "cache_list", "cache_stage")


#: an interrupt's SIGINT is sent again after this long while its handler has not run, this many times
RESEND_AFTER, RESEND_TRIES = 0.05, 40


class Agent(ValueExchange):
    def __init__(self, channel: Channel, watchdog_pid: int | None = None, stacks_at: dict | None = None) -> None:
        self.channel = channel
        self.watchdog_pid = watchdog_pid
        self.stacks_at = stacks_at  # where this process dumps every thread's stack on a signal (stacks.py)
        self.inbox = None
        self.current = None
        self.interrupt_for = None  # a request interrupted before it started
        self._interrupt_lock = threading.Lock()
        self._sigint_taken = threading.Event()  # our SIGINT handler ran since the last interrupt was sent
        self.in_user_code = False
        self.main_ident = threading.get_ident()
        self.runner = None
        self.exit_requested = False  # exit() in a cell: this session ends once the cell is done
        self.pump = None
        self.jax = None
        self.sampler = None
        self.profiler = Profiler(self)
        self.relay = Relay(None)
        self.fetches = Fetches(self.send, self.relay)  # %tpu_fetch: on side threads, beside cells
        self.arriving: dict = {}  # request id -> transfer.Assembly of a value coming in parts
        self.lent: set[int] = set()  # memfds of pulled values the kernel has not mapped yet

    # -- frames out ---------------------------------------------------------------------
    def send(self, message: dict, blob: bytes = b"") -> None:
        """Send a frame; one too large for the session is replaced by a note, never sent (the
        session would drop the whole stream) and never fatal here."""
        try:
            self.channel.send(message, blob)
        except protocol.FrameTooLarge as exc:
            self.channel.send({"op": "stream", "id": message.get("id"), "name": "stderr",
                               "text": f"[tpunb] not sent: {exc}\n"})

    def send_event(self, kind: str, **fields) -> None:
        self.send({"op": "event", "id": self.current, "kind": kind, **fields})

    def send_result(self, data: dict, metadata: dict) -> None:
        self.pump.drain()
        self.send({"op": "result", "id": self.current, "data": cap_bundle(_jsonable(data)), "metadata": _jsonable(metadata)})

    def send_display(self, data: dict, metadata: dict, transient: dict, update: bool) -> None:
        self.pump.drain()
        self.send({"op": "display", "id": self.current, "data": cap_bundle(_jsonable(data)),
                   "metadata": _jsonable(metadata), "transient": _jsonable(transient), "update": update})

    def send_error(self, ename: str, evalue: str, traceback_lines: list) -> None:
        self.pump.drain()
        try:
            hint = None if ename == "JaxStartError" else diagnose.explain_error(evalue)  # that one says it
        except Exception:  # a diagnosis must never lose the error itself
            hint = None
        if hint:
            evalue, traceback_lines = f"{evalue}\n[tpunb] {hint}", [*traceback_lines, f"[tpunb] {hint}"]
        self.send({"op": "error", "id": self.current, "ename": ename, "evalue": cap_text(evalue),
                   "traceback": [cap_text(str(line)) for line in traceback_lines[-1000:]]})

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, init: dict | None = None) -> None:
        """Say hello, take the init frame (brought by the launcher, or already sent after the
        bundle: no round trip), set up. IPython's import (the longest step) runs on a thread from
        the first moment; without settings yet (a standby, or init sent after the bundle) the hello
        waits for it, so a kernel that sees the hello knows the rest of the start is short."""
        importing = _import_ipython_early()
        if importing is not None and init is None:  # hello once imported: a standby that said it is ready
            importing.join()  # a first start loses nothing: its "ready" waits for the import anyway
        self.send({"op": "hello", "protocol": protocol.PROTOCOL_VERSION, "pid": os.getpid(),
                   "pgid": os.getpgid(0), "watchdog": self.watchdog_pid, "python": sys.version.split()[0],
                   "hostname": socket.gethostname(), "magic": protocol.MAGIC, "optimize": sys.flags.optimize,
                   "versions": _versions(), "stacks": self.stacks_at, "executable": sys.executable})
        if init is None:
            frame = self.channel.recv()
            if frame is None:
                os._exit(0)
            init = frame[0]
        if init.get("op") != "init":
            os._exit(2)
        # marshal frames when the kernel runs this same Python (it decides the same from our hello)
        self.channel.fast = bool(init.get("marshal")) and init.get("magic", protocol.MAGIC) == protocol.MAGIC
        self.relay = Relay(init.get("relay_secret"))  # the slice's secret: in this frame only, over SSH
        self.fetches = Fetches(self.send, self.relay)
        os.environ.update({k: str(v) for k, v in (init.get("env") or {}).items()})
        settle_cache()
        if init.get("cwd"):
            try:
                os.chdir(os.path.expanduser(init["cwd"]))
            except OSError:
                pass
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        self.pump = OutputPump(self.channel, init.get("drop_output"), init.get("drop_fragments"))
        self.flusher = Flusher(*self.pump.python_fds)
        sys.stdout, sys.stderr = self.flusher.streams
        sys.stdin = NoStdin()
        signal.signal(signal.SIGINT, self._on_sigint)
        if init.get("jax"):
            if init["jax"].get("metadata") and "MEGASCALE_NUM_SLICES" in os.environ:
                JaxStarter.megascale_from_metadata()  # a cloud multislice: the VM's own values win
            self.jax = JaxStarter(self, init["jax"])
            sys.meta_path.insert(0, self.jax)
        install_log_shim()
        interval = float((init.get("metrics") or {}).get("interval", 1.0))
        if interval > 0:
            self.sampler = Sampler(self.send, interval)
            self.sampler.start()
        if init.get("idle"):
            self._arm_idle(init["idle"])
        self.channel.place_blobs(self._place)  # pushed values are read straight into place
        self.inbox = make_inbox(self.channel, self._dispatch, self._session_gone)
        error = self._make_runner(bool(init.get("ipython", True)), importing)
        self.started_with = (dict(os.environ), os.getcwd())  # what op_reset goes back to
        self.send({"op": "ready", "runner": self.runner.kind, "runner_error": error, "inbox": self.inbox.kind})
        if float(init.get("heartbeat") or 0) > 0:
            self.channel.heartbeat(float(init["heartbeat"]))

    def _make_runner(self, wants_ipython: bool, importing: threading.Thread | None) -> str:
        """The cell runner: IPython's shell where the host has IPython (imported on a thread since
        the agent started), else plain exec; why IPython could not be used, or ''."""
        error = ""
        if wants_ipython:
            if importing is not None:
                importing.join()
            try:
                prefer_inline_matplotlib()
                self.runner = make_ipython_runner(self)
            except Exception as exc:  # no IPython here (or a broken one): plain exec still works
                error = f"{type(exc).__name__}: {exc}"
        if self.runner is None:
            self.runner = PlainRunner(self)
        return error

    @staticmethod
    def _arm_idle(config: dict) -> None:
        """Host 0 of a slice with idle autodelete: a kernel attaches, so arm (or touch) the watchdog,
        busy until the kernel's launch or connect is done (it sends ``idle``)."""
        try:
            idle.arm(config, config.get("source") or "", attaching=True)
        except Exception as exc:  # never fail the start over it; the boot path may still have armed it
            print(f"tpunb: idle autodelete could not be armed here: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _on_sigint(self, signum, frame) -> None:
        self._sigint_taken.set()
        if self.in_user_code:
            raise KeyboardInterrupt

    def _session_gone(self) -> None:
        """End of the session's stream: end this host session, children too."""
        try:
            idle.touch()  # a request may have run until now: the idle time starts here
        except OSError:
            pass
        preempt.wait_saved(preempt.WINDOW)  # the guest's shutdown took the connection: finish the snapshot first
        self.end()

    def _dispatch(self, message: dict, blob: bytes) -> bool:
        """Act on a frame that is not a request (from whichever thread reads); True for a request,
        which the main thread runs."""
        op = message.get("op")
        if protocol.OPS.get(op, protocol.MAIN) == protocol.MAIN:  # unknown ops too: the main loop says so
            return True
        if op == "part":  # a piece of a pushed value: placed at once, whichever thread reads
            self._take_part(message, blob)
        elif op == "interrupt":
            if message.get("id") is not None:
                self.arriving.pop(message["id"], None)  # a push stopped part way: dropped
                self._interrupt_cell(message["id"])
        elif op == "release":  # the kernel mapped a pulled value: its memfd may go
            if message.get("fd") in self.lent:
                self.lent.discard(message["fd"])
                os.close(message["fd"])
        elif op in PROFILE_OPS:  # answered on a side thread: works while a cell runs
            self.profiler.handle(message)
        elif op == "start_jax":
            if self.jax is not None:
                self.jax.start_in_background()
        elif op == "heartbeat":
            self.channel.heartbeat(float(message.get("seconds", 1.0)))
        elif op == "idle":  # the kernel starts or ends a request: activity for the idle watchdog
            try:
                idle.touch(bool(message.get("busy")))
                if not message.get("busy"):
                    idle.launched()  # a kernel is done launching or attaching: a boot-only watchdog ends
            except OSError:
                pass
        elif op == "environ":  # secrets (%tpu_secret): in this process's environment from now on
            os.environ.update({str(k): str(v) for k, v in (message.get("values") or {}).items()})
        elif op == "metrics_interval":
            self._set_metrics_interval(float(message.get("seconds", 1.0)))
        elif op in FETCH_OPS:  # a fetch's parts: its request, a chunk through the kernel, a cancel
            self.fetches.handle(message, blob)
        elif op in RELAY_OPS:  # the listener's address, or a transfer given up
            reply = self.relay.handle(message)
            if reply is not None:
                self.send({"op": "done", "id": message.get("id"), **reply})
        elif op == "diagnose":  # answered on a side thread: works while a cell runs
            quiet_thread(self._diagnose, "tpunb-diagnose", message)
        elif op in CACHE_OPS:  # the compile cache: its hits, its entries (staged on a side thread)
            quiet_thread(self._compile_cache, "tpunb-compile-cache", message)
        return False

    def _compile_cache(self, message: dict) -> None:
        op = message.get("op")
        try:
            if op == "cache_stats":
                reply = {"status": "ok", **jaxcache.stats()}
            elif op == "cache_list":
                reply = {"status": "ok", **jaxcache.listing()}
            else:
                reply = jaxcache.stage(list(message.get("keys") or ()))
        except OSError as exc:
            reply = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        self.send({"op": "done", "id": message.get("id"), **reply})

    def _diagnose(self, message: dict) -> None:
        try:
            reply = diagnose.answer(self.jax.config if self.jax else None, float(message.get("probe_s", 5.0)))
        except Exception as exc:  # one line back to the kernel, whatever broke
            reply = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        self.send({"op": "done", "id": message.get("id"), **reply})

    def _set_metrics_interval(self, seconds: float) -> None:
        """0 stops sampling; anything else (re)starts it at that period."""
        if seconds <= 0:
            if self.sampler is not None:
                self.sampler.stop()
                self.sampler = None
        elif self.sampler is None:
            self.sampler = Sampler(self.send, seconds)
            self.sampler.start()
        else:
            self.sampler.set_interval(seconds)

    def _interrupt_cell(self, rid) -> None:
        """Interrupt the request ``rid``: now if it runs, else as soon as it starts (a reader
        thread may read an interrupt before the main thread took up its request)."""
        with self._interrupt_lock:
            self.interrupt_for = rid
            if rid == self.current and self.in_user_code:
                self.interrupt_for = None
                self._interrupt()

    def _interrupt(self) -> None:
        """What Ctrl-C in a terminal does: SIGINT to the running code and to its child processes."""
        self._sigint_taken.clear()
        signal.pthread_kill(self.main_ident, signal.SIGINT)
        if threading.get_ident() != self.main_ident:  # sent from the main thread, its handler has run
            quiet_thread(self._resend_sigint, "tpunb-interrupt", self.current)
        for pid in watchdog.members(pgid=os.getpgid(0)):
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pass

    def _resend_sigint(self, rid) -> None:
        """Python runs a signal's handler at its next bytecode, or when a blocking call fails with
        EINTR. A SIGINT that lands just before the main thread enters one (``time.sleep``, a read)
        interrupts nothing, and its handler waits for the call to return. Sent again while the
        request runs and the handler has not, it interrupts the call."""
        for _ in range(RESEND_TRIES):
            if self._sigint_taken.wait(RESEND_AFTER) or self.current != rid:
                return
            signal.pthread_kill(self.main_ident, signal.SIGINT)

    def serve(self) -> None:
        while True:
            try:
                message, blob = self.inbox.next_request()
            except KeyboardInterrupt:  # a late interrupt for a cell that already ended
                continue
            handler = getattr(self, "op_" + str(message.get("op")), None)
            if handler is None:
                self.send({"op": "done", "id": message.get("id"), "status": "error",
                           "error": f"unknown request {message.get('op')!r}"})
                continue
            with preempt.MAIN:  # a preemption snapshot taken while idle holds the next request
                handler(message, blob)
            if self.exit_requested:  # the kernel sees the host end; its next cell starts a fresh one
                self.end()

    def end(self) -> None:
        """End this host session and everything its cells started."""
        try:
            os.killpg(os.getpgid(0), signal.SIGTERM)
        finally:
            os._exit(0)

    # -- requests -------------------------------------------------------------------------
    def _as_user_code(self, message: dict, work, figures: bool = False) -> None:
        """Run ``work()`` as the request ``message`` names: interruptible, its output tagged with the
        request, then (``figures``) its unshown matplotlib figures, then one ``done`` frame carrying
        what ``work`` returned (or 'interrupted')."""
        if self.flusher.flush_before_cell():  # what background threads printed since the last cell: not this cell's
            self.pump.drain()
        self.current = self.pump.cell_id = message["id"]
        started = time.perf_counter()
        reply = None
        try:
            self.in_user_code = True  # first: an interrupt read from now on stops the cell
            if self.interrupt_for == message["id"]:  # read before the request was taken up
                self._interrupt_cell(message["id"])
            self.inbox.cell_started()  # frames that come now are read beside the cell
            reply = work()
        except KeyboardInterrupt:
            pass
        finally:
            self.in_user_code = False
            self.inbox.cell_ended()
        if figures:
            try:
                flush_figures(self)
            except Exception as exc:  # the cell ran: it stays ok, and its output says what was not shown
                print(f"tpunb: the cell ran, but its figures could not be shown: {type(exc).__name__}: "
                      f"{(str(exc).strip().splitlines() or [''])[0]}", file=sys.stderr, flush=True)
        self.pump.drain()
        if self.sampler is not None:  # the cell's tpunb.log values reach the kernel before its done
            self.sampler.send_logged()
        self.send({"op": "done", "id": message["id"], **(reply or {"status": "interrupted"}),
                   "seconds": time.perf_counter() - started, **({"exiting": True} if self.exit_requested else {})})
        self.current = self.pump.cell_id = None

    def op_exec(self, message: dict, blob: bytes) -> None:
        self._as_user_code(message, lambda: {"status": self.runner.run(message["code"], message.get("count"),
                                                                           message.get("colors"),
                                                                           blob if message.get("compiled") else b"")},
                           figures=True)

    def op_reset(self, message: dict, blob: bytes) -> None:
        """Back to how this session started, without a restart: the namespace emptied, the
        environment and working directory as the start left them. The reply names the variables
        that had changed and lists what lies in the ``folders`` the kernel names (tpunb's own on
        the host), so that whoever shares the host can tell what was left behind (tests/warm.py)."""
        environment, cwd = self.started_with
        if self.jax is not None:  # what importing jax set belongs to the session, as JAX does
            environment = {**environment, **self.jax.set_by_jax}
        changed = sorted(k for k in set(os.environ) | set(environment) if os.environ.get(k) != environment.get(k))
        os.environ.clear()
        os.environ.update(environment)
        try:
            os.chdir(cwd)
        except OSError:
            pass
        self.runner.reset()
        self.send({"op": "done", "id": message["id"], "status": "ok", "environ": changed,
                   "folders": folders(message.get("folders") or {})})

    def op_shell(self, message: dict, blob: bytes) -> None:
        """A shell command with the host's environment; output streams, the exit code comes back."""
        import subprocess

        def run() -> dict:
            try:
                code = subprocess.call(message["command"], shell=True,
                                       executable="/bin/sh" if os.path.exists("/bin/sh") else None)
            except OSError as exc:
                print(f"cannot run the command: {exc}", file=sys.stderr)
                code = 127
            return {"status": "ok" if code == 0 else "error", "exit_code": code}

        self._as_user_code(message, run)


def _versions() -> dict | str | None:
    """This host's package versions for the kernel's skew check; never a reason not to start.
    "kernel": a host on the kernel's own Python, whose versions the kernel has (reading package
    metadata costs each of a 256-host local slice's processes about 10 ms of this machine's CPU)."""
    if os.environ.get("TPUNB_KERNEL_PYTHON") == sys.executable:
        return "kernel"
    try:
        return diagnose.versions()
    except Exception:
        return None


def folders(places: dict[str, bool], most: int = 200, walked: int = 20000) -> dict[str, list[str]]:
    """What lies in each place (``~`` and ``$VARIABLES`` expanded; one unset is left out):
    relative paths, sorted, every file below it where its value is True (but a compile cache's
    entries), else its own entries only. Past ``most`` a place, the ``most`` newest: what a cell
    just left is what a reset's reader looks for, in a home that has gathered years of files."""
    listed = {}
    for place, below in places.items():
        root = os.path.expanduser(os.path.expandvars(place))
        if "$" in root:
            continue
        found = []
        for top, dirs, files in os.walk(root):
            found += [os.path.join(top, name) for name in (files if below else dirs + files)]
            dirs[:] = sorted(d for d in dirs if d != "jax-cache") if below else []
            if len(found) >= walked:
                break
        if len(found) > most:
            found = sorted(found, key=_changed, reverse=True)[:most]
        listed[place] = sorted(os.path.relpath(path, root) for path in found)
    return listed


def _changed(path: str) -> int:
    try:
        return os.lstat(path).st_mtime_ns
    except OSError:  # gone since the walk
        return 0


def _jsonable(value):
    """Display data as JSON: bytes become base64 (as Jupyter does), unknown objects their repr."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _import_ipython_early() -> threading.Thread | None:
    """IPython's modules, imported on a thread while the handshake waits on the network."""
    import importlib.util

    try:
        if importlib.util.find_spec("IPython") is None:
            return None
    except (ImportError, ValueError):
        return None

    def load() -> None:
        try:
            import IPython.core.interactiveshell  # noqa: F401 - the import is the point
        except Exception:  # the runner says why when it is made
            pass

    thread = threading.Thread(target=load, daemon=True, name="tpunb-import-ipython")
    thread.start()
    return thread


def main(init: dict | None = None) -> None:
    """``init``: this host's init frame when the launcher brought it (else it is read from stdin)."""
    try:
        os.setsid()  # our own session and group: escalation and the watchdog end us and our children together
    except OSError:
        pass  # already a session leader (sshd and the local transport make us one)
    guard = watchdog.start()  # before any thread exists
    stacks_at = stacks.install()  # after the fork: the watchdog has no dump of its own
    in_fd, out_fd = os.dup(0), os.dup(1)
    channel = Channel(in_fd, out_fd)
    agent = Agent(channel, guard, stacks_at)
    agent.start(init)
    agent.serve()


if __name__ == "__main__":
    main()
