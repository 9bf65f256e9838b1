"""What every backend shares: the environment each host gets, whether a slice's owner runs, and
what a slice costs (or would cost) on Cloud TPU at list price."""
from __future__ import annotations

import os

from tpunb import catalog
from tpunb.errors import TpunbError
from tpunb.machine import procs
from tpunb.registry import SliceRecord, process_start

#: CPU collectives (gloo) print a line per communicator from C++ threads, unconditionally and
#: sometimes interleaved: any line with these fragments is noise on a simulated slice (and on
#: SSH hosts running JAX on CPU)
GLOO_CHATTER = r"\[Gloo\]|peer ranks"
#: what is left of such a line when threads interleave their writes ("7", " is connected to ")
GLOO_FRAGMENTS = r"(?:\s|\d|[.:]|\[Gloo\]|Rank|is connected to|peer ranks|Expected number of connected|is)*"
#: what the agent's output pump is told to drop (see host/io.py)
DROP_NOISE = {"drop_output": GLOO_CHATTER, "drop_fragments": GLOO_FRAGMENTS}


#: where JAX's multislice runtime (megascale) listens on host 0 of slice 0: our choice (Ray's TPU
#: utilities use 8081; no Google page states libtpu's default; see docs/cloud-facts.md)
MEGASCALE_PORT = 8080


#: the most a host's own compile cache keeps (JAX evicts the least recently used entries past it)
LOCAL_CACHE_BYTES = 20 << 30


def compile_cache_env(record: SliceRecord, home: str) -> dict[str, str]:
    """JAX's persistent compilation cache, on for every host: the slice's ``--compile-cache
    gs://...`` (shared by every slice given it), else ``jax-cache`` in the host's tpunb folder
    (``home``: ~ is the host's own home), which a restart finds again (and ``%tpu_restart`` copies
    process 0's entries to the other hosts: JAX writes from process 0 only). On a host's own disk
    programs are cached however quickly they compile and however small, up to LOCAL_CACHE_BYTES
    (JAX's LRU eviction, which needs filelock on the hosts); in Cloud Storage, where each write is a
    request, JAX's own thresholds keep tiny compiles out (a second of compile time). vLLM on TPU
    reads its own variable for the same cache."""
    shared = record.spec.get("compile_cache")
    place = shared or f"{home}/jax-cache"
    env = {"JAX_COMPILATION_CACHE_DIR": place, "VLLM_XLA_CACHE_PATH": place}
    if shared:
        return env
    return {**env, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
            "JAX_COMPILATION_CACHE_MAX_SIZE": str(LOCAL_CACHE_BYTES)}


def host_env(record: SliceRecord, index: int, home: str = "~/.tpunb") -> dict[str, str]:
    """What every host gets in its environment: where it sits in the slice (and in a multislice,
    which slice, plus what JAX's multislice runtime reads), the compile cache (``home``: where the
    host keeps tpunb's files), plus --env values."""
    slices = int(record.spec.get("slices") or 1)
    slice_index = index // max(1, len(record.hosts) // slices)
    env = {"TPUNB_HOST_INDEX": str(index), "TPUNB_NUM_HOSTS": str(len(record.hosts)), "TPUNB_SLICE": record.name,
           "TPUNB_SLICE_INDEX": str(slice_index), **compile_cache_env(record, home)}
    if record.accelerator:
        env["TPUNB_ACCELERATOR"] = record.accelerator
    if slices > 1:
        first = record.hosts[0]  # host 0 of slice 0, on the network the slices share (its internal IP)
        coordinator = first.info.internal_ip or first.address.rsplit(":", 1)[0]
        env.update(MEGASCALE_COORDINATOR_ADDRESS=f"{coordinator}:{MEGASCALE_PORT}", MEGASCALE_NUM_SLICES=str(slices),
                   MEGASCALE_SLICE_ID=str(slice_index), MEGASCALE_PORT=str(MEGASCALE_PORT))
    return env


def pid_alive(pid: int | None) -> bool:
    """A process with this pid runs (a zombie does not): tpunb.procs.alive."""
    return procs.alive(pid)


def owner_running(record: SliceRecord) -> bool:
    """The process that owns this slice's host sessions runs: its pid is alive and, where its
    start time was recorded, is still that process (not a later one given the same pid)."""
    if not pid_alive(record.owner_pid):
        return False
    started = process_start(record.owner_pid)
    return record.owner_start is None or started is None or started == record.owner_start


def owner_alive(record: SliceRecord) -> bool:
    """Another live process (a kernel) owns this slice's host sessions."""
    return record.owner_pid != os.getpid() and owner_running(record)


def price_per_hour(accelerator: catalog.Accelerator, spot: bool, slices: int = 1) -> float | None:
    """The slice's list price (every slice of a multislice), or None for a generation without a public one."""
    try:
        return accelerator.price_per_hour(spot) * slices
    except TpunbError:
        return None


def list_price(record: SliceRecord) -> float | None:
    """What a recorded slice (every slice of a multislice) costs, or would cost, on Cloud TPU; None
    when no source gives it (TPU7x, flex-start)."""
    if record.spec.get("flex"):  # no source gives flex-start's price: never the on-demand rate in its place
        return None
    try:
        accelerator = catalog.lookup(record.accelerator) if record.accelerator else None
    except TpunbError:
        return None
    return price_per_hour(accelerator, bool(record.spec.get("spot")), record.num_slices) if accelerator else None
