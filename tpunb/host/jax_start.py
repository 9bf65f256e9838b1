"""Start jax.distributed the moment any code imports jax, so the first cell already sees the
whole slice and users never write set-up code.

Shipped to hosts: standard library only (see the package docstring); jax is imported only by
the user's own ``import jax``, which this hook follows.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading

from . import diagnose, jaxcache
from .io import quiet_thread


#: where JAX's persistent compilation cache (and vLLM's, on TPU) is: the kernel sets both, ~ for the home
CACHE_VARIABLES = ("JAX_COMPILATION_CACHE_DIR", "VLLM_XLA_CACHE_PATH")


def settle_cache(environ=os.environ) -> None:
    """The compile cache's place as this host spells it (neither JAX nor vLLM expands ~). Its
    size bound needs filelock (JAX's LRU eviction refuses to start without it): a host whose
    environment lacks filelock keeps an unbounded cache rather than none. Against a Cloud
    Storage stand-in (the sandbox), gcsfs skips its bucket-layout lookup, an API the stand-in
    lacks, which would warn at every cache access."""
    for key in CACHE_VARIABLES:
        if environ.get(key, "").startswith("~"):
            environ[key] = os.path.expanduser(environ[key])
    if environ.get("JAX_COMPILATION_CACHE_MAX_SIZE"):
        import importlib.util

        if importlib.util.find_spec("filelock") is None:
            del environ["JAX_COMPILATION_CACHE_MAX_SIZE"]
    if environ.get("STORAGE_EMULATOR_HOST"):
        environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def tpu_env(timeout: float = 2.0) -> dict:
    """The VM's ``tpu-env`` metadata (``KEY: 'value'`` lines), read as JAX's cloud_tpu_cluster
    does, from $GCE_METADATA_IP (else $GCE_METADATA_HOST, which names the same server for google-auth,
    else metadata.google.internal); {} when there is none."""
    import urllib.request

    host = os.environ.get("GCE_METADATA_IP") or os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/attributes/tpu-env",
                                     headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            text = answer.read().decode()
    except (OSError, ValueError):
        return {}
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            values[key.strip()] = value.strip().strip("'")
    return values


class _quiet_cluster_detection:
    """JAX logs an error when cluster "gcetpu" is asked for off a TPU (the sandbox: no chips to
    find), then reads the VM's metadata all the same; that line says nothing to a user."""

    def __enter__(self):
        import logging

        self.logger = logging.getLogger("jax._src.clusters.cluster")
        self.filter = lambda record: "not functional in this environment" not in record.getMessage()
        self.logger.addFilter(self.filter)

    def __exit__(self, *exc) -> None:
        self.logger.removeFilter(self.filter)


class JaxStartError(RuntimeError):
    """JAX cannot start on this host, for a reason said in one line (a blocked coordinator
    port, a TPU another process holds): raised in the cell instead of a hang of minutes."""


def check_backend(jax_module, tpu: bool | None = None, environ=os.environ) -> None:
    """On a host with TPU chips (prepare.has_tpu, as JAX decides it), JAX must have started on them:
    a jax and libtpu that cannot drive the chip fall back to the CPU with a warning, and every cell
    would then "work" there. Unless JAX_PLATFORMS asks for the CPU first, that is one error naming
    both versions."""
    platforms = [p.strip().lower() for p in environ.get("JAX_PLATFORMS", "").split(",") if p.strip()]
    if platforms[:1] == ["cpu"]:
        return
    from .prepare import has_tpu

    if not (has_tpu() if tpu is None else tpu):
        return
    backend = jax_module.default_backend()
    if backend == "tpu":
        return
    import importlib.metadata

    try:
        libtpu = f"libtpu {importlib.metadata.version('libtpu')}"
    except importlib.metadata.PackageNotFoundError:
        libtpu = "no libtpu"
    raise JaxStartError(f"this host has TPU chips, but JAX started on {backend}: jax {jax_module.__version__} with "
                        f"{libtpu} cannot drive them; relaunch with a newer --jax (the generation's minimum is in "
                        "docs/cloud-facts.md), or set JAX_PLATFORMS=cpu to run on the CPU on purpose")


class _AfterImportLoader(importlib.abc.Loader):
    def __init__(self, inner, before, after) -> None:
        self.inner, self.before, self.after = inner, before, after

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.before()
        self.inner.exec_module(module)
        self.after(module)


class JaxStarter(importlib.abc.MetaPathFinder):
    """Runs jax.distributed.initialize right after ``import jax``, once, with the slice's layout."""

    def __init__(self, agent, config: dict) -> None:
        self.agent, self.config = agent, config
        self.started = threading.Event()
        self.state = "not started"
        #: the variables importing jax set (TF_CPP_MIN_LOG_LEVEL, ...): the session's, not a cell's
        self.set_by_jax: dict[str, str] = {}
        self._before: dict[str, str] = {}

    def find_spec(self, name, path=None, target=None):
        if name != "jax" or self.started.is_set():
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _AfterImportLoader(spec.loader, self.check, self._initialize)
        return spec

    def _initialize(self, jax_module) -> None:
        if self.started.is_set():
            return
        self.set_by_jax = {k: v for k, v in os.environ.items() if self._before.get(k) != v}
        self.started.set()
        self.state = "initializing"
        self.agent.send_event("jax_starting")
        jaxcache.listen(jax_module)  # the compile cache's hits and misses on this host
        import inspect
        import jax.distributed as distributed

        kwargs = dict(self.config.get("kwargs") or {})
        accepted = inspect.signature(distributed.initialize).parameters
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
        if self.config.get("initialize", True):
            try:
                with _quiet_cluster_detection():
                    distributed.initialize(**kwargs)
            except Exception as exc:
                self.state = f"failed: {exc}"
                self.agent.send_event("jax_failed", error=f"{type(exc).__name__}: {exc}")
                raise
        original = distributed.initialize

        def initialize(*args, **kw):
            """Already initialized by tpunb for this slice; calling it again is harmless."""
            return None

        initialize.__wrapped__ = original
        distributed.initialize = initialize
        try:
            check_backend(jax_module)
        except JaxStartError as exc:
            self.state = f"failed: {exc}"
            self.agent.send_event("jax_failed", error=str(exc))
            raise
        self.state = "ready"
        self.agent.send_event("jax_ready")
        from . import preempt

        preempt.jax_ready()  # an armed host's snapshot code, loaded before any notice

    def check(self) -> None:
        """Before jax loads: the TPU is free, and the coordinator's port answers. A failure leaves
        nothing of JAX behind, so the same import starts it once the cause is gone."""
        if self.started.is_set():
            return
        self._before = dict(os.environ)
        kwargs = self.config.get("kwargs") or {}
        host = kwargs.get("process_id", int(os.environ.get("TPUNB_HOST_INDEX") or 0))
        platforms = os.environ.get("JAX_PLATFORMS", "")
        why = None
        if not platforms or "tpu" in platforms.split(","):
            why = diagnose.tpu_busy(host)
        address = kwargs.get("coordinator_address") or self.config.get("coordinator")
        probe = self.config.get("probe") or {}
        checking = bool(address and self.config.get("initialize", True) and probe.get("seconds", 0) > 0)
        if not why and checking and host == 0:
            why = diagnose.port_taken(int(address.rpartition(":")[2]), float(probe["seconds"]))
        if not why and checking:
            silence = diagnose.probe(address, float(probe["seconds"]))
            if silence:
                why = (f"host {host} cannot reach the JAX coordinator at {address} ({silence}): port "
                       f"{address.rpartition(':')[2]} is blocked. {probe.get('fix') or ''}").strip()
        if why:
            self.state = f"failed: {why}"
            self.agent.send_event("jax_failed", error=why)
            raise JaxStartError(why)
        # jaxlib's load (a large shared library, its static set-up) and the backend's start hold the
        # GIL for seconds on a busy host: no heartbeat can leave meanwhile, so the kernel is told first
        self.agent.send_event("jax_loading")

    @staticmethod
    def megascale_from_metadata() -> dict:
        """A Cloud TPU VM's own MEGASCALE_* values (its ``tpu-env`` metadata), which JAX and libtpu
        read there too: set in this process's environment where the VM has them, replacing every
        MEGASCALE_* the kernel set (its port is a guess for hosts without tpu-env)."""
        found = {k: v for k, v in tpu_env().items() if k.startswith("MEGASCALE_")}
        if found:  # the VM says: none of the kernel's guesses (a port) stays beside its values
            for key in [k for k in os.environ if k.startswith("MEGASCALE_") and k not in found]:
                del os.environ[key]
        os.environ.update(found)
        return found

    def start_in_background(self) -> None:
        """Another host started JAX: join it now, or its initialize() would wait for us."""
        if self.started.is_set() or "jax" in sys.modules:
            return

        def importer() -> None:
            try:
                import jax  # the import hook joins jax.distributed

                jax.devices()  # and the backend: hosts exchange their topologies when it starts
            except Exception as exc:  # no cell of this host shows it: the kernel says it once
                self.state = f"failed: {exc}"
                self.agent.send_event("jax_failed", error=f"{type(exc).__name__}: {exc}", background=True)

        quiet_thread(importer, "tpunb-jax-start")


