"""Through a real Jupyter kernel (jupyter_client), as JupyterLab drives it: the kernel interrupt."""
from __future__ import annotations

import queue
import time

import pytest
from jupyter_client.manager import start_new_kernel


@pytest.fixture
def kernel(isolated_home):
    manager, client = start_new_kernel(kernel_name="python3")
    yield manager, client
    client.stop_channels()
    manager.shutdown_kernel(now=True)


def execute(client, code: str, on_output=None, timeout: float = 120):
    """Run code; collect iopub outputs until idle; returns (reply content, outputs).

    Sent with ``stop_on_error=False``: after a cell's error ipykernel aborts the requests that reach
    it before its stop-aborting callback runs (``Kernel._abort_queues``), and a test sends its next
    request the moment the reply comes, which a loaded machine let land inside that window (an
    "aborted" reply in a fresh-clone run). A user's next cell comes later; no test here is about
    ipykernel's aborting."""
    msg_id = client.execute(code, stop_on_error=False)
    outputs = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no reply to {code!r} within {timeout} s") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in ("stream", "error", "display_data", "update_display_data", "execute_result"):
            outputs.append(msg["content"])
            if on_output:
                on_output(msg["content"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    while True:  # skip stale replies (start_new_kernel may leave extra kernel_info replies when slow)
        reply = client.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], outputs


@pytest.mark.fresh_slice
def test_kernel_interrupt_reaches_every_host_within_a_second(kernel):
    manager, client = kernel
    reply, _ = execute(client, "%load_ext tpunb\n%tpu_launch v4-32")
    assert reply["status"] == "ok"
    execute(client, "%%on_tpu\nstate = 'kept'")
    interrupted = {}

    def on_output(content):
        if content.get("text", "").count("sleeping") and "at" not in interrupted:
            interrupted["at"] = time.perf_counter()
            manager.interrupt_kernel()

    reply, outputs = execute(client, "%%on_tpu\nimport time\nprint('sleeping', flush=True)\ntime.sleep(60)",
                             on_output=on_output)
    elapsed = time.perf_counter() - interrupted["at"]
    assert reply["status"] == "error" and reply["ename"] == "CellInterrupted"
    assert "interrupted on hosts 0-3; their state is kept" in reply["evalue"]
    assert elapsed < 15  # the interrupt ended the 60 s sleep; escalation did not: their state is kept
    reply, outputs = execute(client, "%%on_tpu\nstate")
    assert reply["status"] == "ok"
    assert any("Out[0-3]: 'kept'" in o.get("data", {}).get("text/plain", "") for o in outputs)
    execute(client, "%tpu_down")
