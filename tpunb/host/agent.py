"""The agent: one long-lived process per host session that runs cells for tpunb.

Shipped to hosts: standard library only (see the package docstring). IPython, matplotlib and
jax are used only when the host has them, inside functions.

How it works: the session sends frames on our stdin (fd 0) and reads frames from a copy of our
original stdout. Fds 0/1/2 are then rewired (``io``), so user code, C libraries and subprocesses
write into pipes that a pump thread turns into ``stream`` frames. Cells run on the main thread
(``runners``); a reader thread delivers interrupts (SIGINT to the main thread) while a cell runs,
and starts JAX in the background when another host of the slice started it (``jax_start``).
"""
from __future__ import annotations

import base64
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time

from . import protocol
from .io import Channel, NoStdin, OutputPump, quiet_thread
from .jax_start import JaxStarter
from .metrics import Sampler, install_log_shim
from .profiler import OPS as PROFILE_OPS, Profiler
from .runners import PlainRunner, flush_figures, make_ipython_runner, prefer_inline_matplotlib


class Agent:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.requests: queue.Queue = queue.Queue()
        self.current = None
        self.in_user_code = False
        self.main_ident = threading.get_ident()
        self.runner = None
        self.pump = None
        self.jax = None
        self.sampler = None
        self.profiler = Profiler(self)

    # -- frames out ---------------------------------------------------------------------
    def send(self, message: dict, blob: bytes = b"") -> None:
        self.channel.send(message, blob)

    def send_event(self, kind: str, **fields) -> None:
        self.send({"op": "event", "id": self.current, "kind": kind, **fields})

    def send_result(self, data: dict, metadata: dict) -> None:
        self.pump.drain()
        self.send({"op": "result", "id": self.current, "data": _jsonable(data), "metadata": _jsonable(metadata)})

    def send_display(self, data: dict, metadata: dict, transient: dict, update: bool) -> None:
        self.pump.drain()
        self.send({"op": "display", "id": self.current, "data": _jsonable(data),
                   "metadata": _jsonable(metadata), "transient": _jsonable(transient), "update": update})

    def send_error(self, ename: str, evalue: str, traceback_lines: list) -> None:
        self.pump.drain()
        self.send({"op": "error", "id": self.current, "ename": ename, "evalue": evalue,
                   "traceback": [str(line) for line in traceback_lines]})

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        try:
            os.setsid()  # our own process group: escalation can end us and our children together
        except OSError:
            pass
        self.send({"op": "hello", "protocol": protocol.PROTOCOL_VERSION, "pid": os.getpid(),
                   "pgid": os.getpgid(0), "python": sys.version.split()[0], "hostname": socket.gethostname()})
        frame = self.channel.recv()
        if frame is None:
            os._exit(0)
        init = frame[0]
        if init.get("op") != "init":
            os._exit(2)
        os.environ.update({k: str(v) for k, v in (init.get("env") or {}).items()})
        if init.get("cwd"):
            try:
                os.chdir(os.path.expanduser(init["cwd"]))
            except OSError:
                pass
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        self.pump = OutputPump(self.channel, init.get("drop_output"), init.get("drop_fragments"))
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stdin = NoStdin()
        signal.signal(signal.SIGINT, self._on_sigint)
        if init.get("jax"):
            self.jax = JaxStarter(self, init["jax"])
            sys.meta_path.insert(0, self.jax)
        runner_error = ""
        if init.get("ipython", True):
            try:
                prefer_inline_matplotlib()
                self.runner = make_ipython_runner(self)
            except Exception as exc:  # no IPython here (or a broken one): plain exec still works
                runner_error = f"{type(exc).__name__}: {exc}"
        if self.runner is None:
            self.runner = PlainRunner(self)
        install_log_shim()
        interval = float((init.get("metrics") or {}).get("interval", 1.0))
        if interval > 0:
            self.sampler = Sampler(self.send, interval)
            self.sampler.start()
        quiet_thread(self._read_loop, "tpunb-reader")
        self.send({"op": "ready", "runner": self.runner.kind, "runner_error": runner_error})

    def _on_sigint(self, signum, frame) -> None:
        if self.in_user_code:
            raise KeyboardInterrupt

    def _read_loop(self) -> None:
        while True:
            try:
                frame = self.channel.recv()
            except Exception:
                frame = None
            if frame is None:  # the session is gone: end this host session, children too
                try:
                    os.killpg(os.getpgid(0), signal.SIGTERM)
                finally:
                    os._exit(0)
            message, blob = frame
            op = message.get("op")
            if op == "interrupt":
                if message.get("id") is not None and message.get("id") == self.current:
                    self._interrupt()
            elif op in PROFILE_OPS:  # answered on a side thread: works while a cell runs
                self.profiler.handle(message)
            elif op == "start_jax":
                if self.jax is not None:
                    self.jax.start_in_background()
            elif op == "metrics_interval":
                self._set_metrics_interval(float(message.get("seconds", 1.0)))
            else:
                self.requests.put((message, blob))

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

    def _interrupt(self) -> None:
        """What Ctrl-C in a terminal does: SIGINT to the running code and to its child processes."""
        signal.pthread_kill(self.main_ident, signal.SIGINT)
        for pid in _children_in_group(os.getpgid(0)):
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pass

    def serve(self) -> None:
        while True:
            try:
                message, blob = self.requests.get()
            except KeyboardInterrupt:  # a late interrupt for a cell that already ended
                continue
            handler = getattr(self, "op_" + str(message.get("op")), None)
            if handler is None:
                self.send({"op": "done", "id": message.get("id"), "status": "error",
                           "error": f"unknown request {message.get('op')!r}"})
                continue
            handler(message, blob)

    # -- requests -------------------------------------------------------------------------
    def _as_user_code(self, message: dict, work, after=None) -> None:
        """Run ``work()`` as the request ``message`` names: interruptible, its output tagged with the
        request, then one ``done`` frame carrying what ``work`` returned (or 'interrupted')."""
        self.current = self.pump.cell_id = message["id"]
        started = time.perf_counter()
        reply = None
        try:
            self.in_user_code = True
            reply = work()
        except KeyboardInterrupt:
            pass
        finally:
            self.in_user_code = False
        if after is not None:
            try:
                after()
            except Exception:
                pass
        self.pump.drain()
        self.send({"op": "done", "id": message["id"], **(reply or {"status": "interrupted"}),
                   "seconds": time.perf_counter() - started})
        self.current = self.pump.cell_id = None

    def op_exec(self, message: dict, blob: bytes) -> None:
        self._as_user_code(message, lambda: {"status": self.runner.run(message["code"], message.get("count"),
                                                                           message.get("colors"))},
                           after=lambda: flush_figures(self))

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

    def op_push(self, message: dict, blob: bytes) -> None:
        try:
            values = pickle.loads(blob)
            self.runner.namespace.update(values)
            self.send({"op": "done", "id": message["id"], "status": "ok"})
        except Exception as exc:
            self.send({"op": "done", "id": message["id"], "status": "error", "error": f"{type(exc).__name__}: {exc}"})

    def op_pull(self, message: dict, blob: bytes) -> None:
        namespace = self.runner.namespace
        missing = [name for name in message["names"] if name not in namespace]
        if missing:
            self.send({"op": "done", "id": message["id"], "status": "error",
                       "error": f"NameError: {', '.join(missing)} not defined on this host"})
            return
        try:
            data = _pickler().dumps({name: namespace[name] for name in message["names"]}, protocol=4)
        except Exception as exc:
            self.send({"op": "done", "id": message["id"], "status": "error",
                       "error": f"cannot send {', '.join(message['names'])} back: {type(exc).__name__}: {exc}"})
            return
        self.send({"op": "done", "id": message["id"], "status": "ok"}, data)


def _pickler():
    """cloudpickle when the host has it (functions and classes defined in cells), else pickle."""
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        return pickle


def _children_in_group(pgid: int) -> list:
    """Processes of our group other than us (Linux /proc); elsewhere, none."""
    me, found = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) == pgid:
                found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


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


def main() -> None:
    in_fd, out_fd = os.dup(0), os.dup(1)
    channel = Channel(in_fd, out_fd)
    agent = Agent(channel)
    agent.start()
    agent.serve()


if __name__ == "__main__":
    main()
