"""The metrics sampler: host, accelerator and user metrics, sent as ``metrics`` frames.

Shipped to hosts: standard library only (see the package docstring). A quiet daemon thread
wakes every ``interval`` seconds, reads each source, and sends what it found in one frame; it
never imports JAX (it reads it only once the user's code has started its backend) and never
touches libtpu in this process (importing libtpu.sdk beside JAX can crash it, and off a TPU its
calls stall): TPU runtime metrics come from a helper process that speaks libtpu's gRPC metric
service, started only where TPU devices exist. A source that fails is dropped after a few
tries, and a tick that fails is said once and sampling goes on; cells never notice. Values a
cell logs are sent when it ends too, before it reports done.

A sample is ``[time, metric, value, chip, step]`` (chip and step None where they do not apply).
"""
from __future__ import annotations

import collections
import glob
import json
import os
import select
import subprocess
import sys
import threading
import time

from .io import quiet_thread

MAX_PENDING_USER = 20_000  # user samples kept between two ticks; older ones are dropped (and counted)
FAILURES_BEFORE_DROP = 3

_pending: collections.deque = collections.deque(maxlen=MAX_PENDING_USER)
_logged = [0]  # user samples ever logged, to count what the bounded queue dropped
#: called with each logged step: a step boundary (``preempt`` saves there when the VM is reclaimed)
STEP_HOOKS: list = []


def log(step: int | None = None, **scalars: float) -> None:
    """Record the user's own metrics (loss, tokens/s, ...) on this host: ``tpunb.log(step, loss=...)``.

    Costs a clock read and a deque append; they are sent at the next tick or the cell's end."""
    now = time.time()
    for name, value in scalars.items():
        _pending.append((now, name, value, step))
    _logged[0] += len(scalars)
    for hook in STEP_HOOKS:
        hook(step)


def install_log_shim() -> None:
    """Make ``import tpunb; tpunb.log(...)`` work on hosts that have only the agent (SSH and cloud
    hosts); where tpunb is installed, its own ``tpunb.log`` forwards here."""
    import importlib.util
    import types

    try:
        if importlib.util.find_spec("tpunb") is not None:
            return
    except (ImportError, ValueError):
        pass
    shim = types.ModuleType("tpunb", "tpunb on a host: only tpunb.log, the metrics of the slice's notebook")
    shim.log = log
    sys.modules["tpunb"] = shim


# -- sources: each returns a list of samples, or raises ------------------------------------------
class ProcStat:
    """Whole-host CPU (from /proc/stat) and this process's CPU, as percent since the last tick."""

    def __init__(self) -> None:
        self.last = None

    def __call__(self, now: float) -> list:
        with open("/proc/stat", "rb") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle, total = fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)
        times = os.times()
        mine = times.user + times.system
        last, self.last = self.last, (idle, total, mine, now)
        if last is None:
            return []
        busy = (total - last[1]) - (idle - last[0])
        samples = []
        if total > last[1]:
            samples.append([now, "cpu_percent", round(100.0 * busy / (total - last[1]), 2), None, None])
        if now > last[3]:
            samples.append([now, "process_cpu_percent", round(100.0 * (mine - last[2]) / (now - last[3]), 2),
                            None, None])
        return samples


def memory(now: float) -> list:
    """Host memory (MemTotal - MemAvailable) and this process's resident set."""
    with open("/proc/meminfo", "rb") as f:
        text = f.read()
    info = {key: int(text[text.index(key) + len(key) + 1:].split(None, 1)[0]) * 1024
            for key in (b"MemTotal", b"MemAvailable")}  # found, not parsed line by line: every host, every second
    with open("/proc/self/statm", "rb") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return [[now, "memory_used_bytes", info[b"MemTotal"] - info[b"MemAvailable"], None, None],
            [now, "memory_total_bytes", info[b"MemTotal"], None, None],
            [now, "rss_bytes", rss, None, None]]


def _started_jax():
    """The jax module once the user's code has started a backend (never started here), else None."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    jax = sys.modules.get("jax")
    return jax if jax is not None and bridge is not None and getattr(bridge, "_backends", None) else None


def jax_devices(now: float) -> list:
    """Per chip, once the user's code has started JAX's backend: memory_stats() where the
    backend answers (TPU, GPU), else the bytes of live arrays on each device (CPU)."""
    jax = _started_jax()
    if jax is None:
        return []  # not imported, or no backend yet: starting one is the user's code's business
    samples, live = [], None
    for chip, device in enumerate(jax.local_devices()):  # chip: the device's index on this host
        stats = device.memory_stats() if hasattr(device, "memory_stats") else None
        if stats:
            samples.append([now, "hbm_used_bytes", stats.get("bytes_in_use", 0), chip, None])
            if stats.get("bytes_limit"):
                samples.append([now, "hbm_total_bytes", stats["bytes_limit"], chip, None])
            continue
        if live is None:
            live = _live_bytes(jax)
        samples.append([now, "hbm_used_bytes", live.get(device.id, 0), chip, None])
    return samples


def _live_bytes(jax) -> dict:
    per_device: dict = {}
    for array in jax.live_arrays():
        try:
            shard = array.sharding.shard_shape(array.shape)
            size = array.dtype.itemsize
            for n in shard:
                size *= n
            for device in array.sharding.addressable_devices:
                per_device[device.id] = per_device.get(device.id, 0) + size
        except Exception:  # deleted under our feet, or an exotic sharding: skip that array
            continue
    return per_device


LIBTPU_READER = r"""
import json, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts are for the user's cell, not for us
import grpc
from tpu_info.proto import tpu_metric_service_pb2 as pb, tpu_metric_service_pb2_grpc as pb_grpc
address, interval = sys.argv[1], float(sys.argv[2])
stub = pb_grpc.RuntimeMetricServiceStub(grpc.secure_channel(address, grpc.local_channel_credentials()))
names = {"hbm_used_bytes": "tpu.runtime.hbm.memory.usage.bytes",
         "hbm_total_bytes": "tpu.runtime.hbm.memory.total.bytes",
         "duty_cycle_percent": "tpu.runtime.tensorcore.dutycycle.percent"}
while True:
    found = []
    for metric, name in names.items():
        try:
            response = stub.GetRuntimeMetric(pb.MetricRequest(metric_name=name), timeout=interval)
        except grpc.RpcError:
            continue
        for m in response.metric.metrics:
            kind = m.gauge.WhichOneof("value")
            found.append([metric, m.attribute.value.int_attr, getattr(m.gauge, kind) if kind else None])
    print(json.dumps(found), flush=True)
    time.sleep(interval)
"""


def local_chips(ids: list[int]) -> dict[int, int]:
    """libtpu's chip ids on this host -> the host's chip numbers 0..n-1. libtpu numbers a host's
    chips slice-wide (8, 9, 12, 13 on one v6e host: tests/fixtures/tpu_info), JAX by its local
    devices: where JAX runs, its local devices' ids give the order; else the ids sorted."""
    order = sorted(set(ids))
    jax = _started_jax()
    if jax is not None:
        try:
            devices = [d.id for d in jax.local_devices()]
        except Exception:  # no backend after all: the sorted ids
            devices = []
        if set(order) <= set(devices):
            order = [d for d in devices if d in set(order)]
    return {chip: index for index, chip in enumerate(order)}


class Libtpu:
    """TPU runtime metrics (HBM, TensorCore duty cycle per chip) through tpu-info's client of
    libtpu's gRPC metric service, read in a helper process beside the user's."""

    DEFAULT_ADDRESS = "localhost:8431"

    def __init__(self, interval: float) -> None:
        self.address = os.environ.get("TPUNB_TPU_METRICS_ADDRESS") or (
            self.DEFAULT_ADDRESS if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") else None)
        self.interval = interval
        self.process = None
        self.buffer = b""
        self.latest: list = []

    def __call__(self, now: float) -> list:
        if self.address is None:
            return []
        if self.process is None:
            self.process = subprocess.Popen([sys.executable, "-c", LIBTPU_READER, self.address, str(self.interval)],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL)
            os.set_blocking(self.process.stdout.fileno(), False)
        if self.process.poll() is not None:
            raise RuntimeError("the libtpu metrics reader ended (no grpcio or tpu-info on this host?)")
        while select.select([self.process.stdout], [], [], 0)[0]:
            chunk = os.read(self.process.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        if lines:
            self.latest = json.loads(lines[-1])
        local = local_chips([chip for _, chip, _ in self.latest])
        return [[now, metric, value, local[chip], None] for metric, chip, value in self.latest if value is not None]

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()


# -- the sampler -----------------------------------------------------------------------------------
class Sampler:
    """Samples every source each ``interval`` seconds and sends one ``metrics`` frame."""

    def __init__(self, send, interval: float = 1.0) -> None:
        self.send = send
        self.interval = interval
        self.libtpu = Libtpu(interval)
        self.sources = {"proc_stat": ProcStat(), "memory": memory, "jax": jax_devices, "libtpu": self.libtpu}
        self.failures: dict = {}
        self.dropped_sources: dict = {}
        self._wake = threading.Event()
        self._stopped = False
        self._sent_logged = _logged[0] - len(_pending)  # a sampler restarted after --interval 0 owes no drops
        self._logged_lock = threading.Lock()
        self.failed_ticks = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = quiet_thread(self._run, "tpunb-metrics")

    def set_interval(self, seconds: float) -> None:
        self.interval = max(0.05, float(seconds))
        self._wake.set()

    def stop(self) -> None:
        """Stop sampling; a sample being taken is sent before this returns, so once the kernel
        hears back from this host no more samples follow."""
        self._stopped = True
        self._wake.set()
        self.libtpu.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stopped:
            started = time.monotonic()
            try:
                self.tick()
            except OSError:  # the channel is gone: the agent is ending
                return
            except Exception as exc:  # one bad tick costs its samples, never the sampling
                self._failed_tick(exc)
            self._wake.wait(max(0.0, self.interval - (time.monotonic() - started)))
            self._wake.clear()

    def _failed_tick(self, exc: Exception) -> None:
        """Say the first failure (as between-cell output on this host's stderr); count the rest."""
        self.failed_ticks += 1
        if self.failed_ticks == 1:
            print(f"[tpunb] a metrics sample failed on this host ({type(exc).__name__}: {exc}); "
                  "its samples are lost, sampling goes on", file=sys.stderr, flush=True)

    def tick(self) -> None:
        now = time.time()
        samples = []
        for name, source in list(self.sources.items()):
            try:
                samples.extend(source(now))
                self.failures.pop(name, None)
            except Exception as exc:  # a missing or broken source is skipped, never an error
                self.failures[name] = self.failures.get(name, 0) + 1
                if self.failures[name] >= FAILURES_BEFORE_DROP:
                    self.dropped_sources[name] = f"{type(exc).__name__}: {exc}"
                    del self.sources[name]
        self._send_with_logged(samples)

    def send_logged(self) -> None:
        """Send what ``tpunb.log`` recorded now, not at the next tick: a cell's end calls this
        before its ``done`` frame, so the kernel holds every step once the cell returns. Sends
        no frame when the cell logged nothing; waits for a tick that is sending logged values."""
        with self._logged_lock:
            if _pending or _logged[0] != self._sent_logged:
                self._send_locked([])

    def _send_with_logged(self, samples: list) -> None:
        with self._logged_lock:
            self._send_locked(samples)

    def _send_locked(self, samples: list) -> None:
        """One ``metrics`` frame of ``samples`` and the logged values not sent yet; the caller
        holds the lock, so values a tick took are sent before a cell's end reports done."""
        user = []
        while _pending:
            t, metric, value, step = _pending.popleft()
            try:  # a jax or numpy scalar becomes a float here, off the user's thread
                user.append([t, metric, float(value), None, None if step is None else int(step)])
            except Exception:  # not a number (or a deleted jax array): skipped, counted as dropped
                continue
        message = {"op": "metrics", "samples": samples + user}
        dropped = _logged[0] - self._sent_logged - len(user)
        self._sent_logged = _logged[0]
        if dropped > 0:
            message["dropped"] = dropped
        if message["samples"] or dropped > 0:
            self.send(message)
