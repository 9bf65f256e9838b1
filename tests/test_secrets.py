"""%tpu_secret: values from the kernel's environment on every host, masked (****) in everything
hosts send back (a value split across frames, tracebacks, last_result, service logs), never stored;
HF_TOKEN goes to launched slices without asking; too short a value is refused in one line."""
from __future__ import annotations

import pytest

from tpunb import manager
from tpunb.engine.masking import MASK, Masker
from tpunb.registry import Registry
from tests.conftest import wait_for

SECRET = "hf_s3cr3t_value_0123456789"


def test_a_value_split_across_stream_frames_is_masked_and_a_held_tail_lets_go():
    masker = Masker()
    masker.add(SECRET)
    out = masker.frames(0, {"op": "stream", "id": 7, "name": "stdout", "text": f"token={SECRET[:6]}"})
    out += masker.frames(0, {"op": "stream", "id": 7, "name": "stdout", "text": f"{SECRET[6:]} ok\n"})
    assert "".join(f["text"] for f in out) == f"token={MASK} ok\n" and SECRET[:3] not in out[0]["text"]
    held = masker.frames(1, {"op": "stream", "id": 8, "name": "stderr", "text": "ends with hf_s"})
    assert [f["text"] for f in held] == ["ends with "]  # "hf_s" could start the secret: held back
    done = masker.frames(1, {"op": "done", "id": 8, "status": "ok"})
    assert [(f["op"], f.get("text")) for f in done] == [("stream", "hf_s"), ("done", None)]  # not a secret after all
    error = masker.frames(0, {"op": "error", "id": 9, "evalue": SECRET, "traceback": [f"x = '{SECRET}'"]})[0]
    assert error["evalue"] == MASK and error["traceback"] == [f"x = '{MASK}'"]
    with pytest.raises(ValueError, match="7 characters"):
        masker.add("short12")


def test_secret_on_every_host_masked_in_output_tracebacks_results_and_logs(make_slice, cell, monkeypatch, isolated_home):
    monkeypatch.setenv("MY_TOKEN", SECRET)
    sl = make_slice(2)
    run = cell("%tpu_secret MY_TOKEN")
    assert run.error is None and run.stdout.startswith("[tpunb] secret MY_TOKEN set on"), run.shown
    shown = cell("%%on_tpu\nimport os, sys\nv = os.environ['MY_TOKEN']\n"
                 "sys.stdout.write(v[:5]); sys.stdout.flush(); sys.stdout.write(v[5:] + '\\n')\n"
                 "print(len(v))\nv")
    assert shown.error is None and SECRET not in shown.shown and MASK in shown.shown, shown.shown
    assert str(len(SECRET)) in shown.stdout  # the hosts have the value itself
    result = manager.last_result()
    assert all(SECRET not in r for r in result.reprs.values()) and all(MASK in r for r in result.reprs.values())
    failed = cell("%%on_tpu\nimport os\nraise ValueError(os.environ['MY_TOKEN'])")
    assert failed.error is not None and SECRET not in failed.shown and SECRET not in str(failed.error)
    started = cell("%tpu_serve echo -- echo the token is $MY_TOKEN")
    assert started.error is None, started.shown
    wait_for(lambda: {s.state for s in sl.services() if s.name == "echo"} == {"exited"}, what="echo to exit")
    logs = cell("%tpu_logs echo")
    assert f"the token is {MASK}" in logs.stdout and SECRET not in logs.stdout, logs.stdout
    assert SECRET.encode() not in (isolated_home / "registry.db").read_bytes()
    assert cell("%tpu_restart").error is None  # new agents start with it too
    again = cell("%%on_tpu\nimport os\nlen(os.environ['MY_TOKEN'])")
    assert f"Out[0-1]: {len(SECRET)}" in again.shown, again.shown


def test_too_short_a_secret_is_refused_and_hf_token_needs_no_asking(cell, monkeypatch, isolated_home):
    monkeypatch.setenv("PIN", "1234")
    refused = cell("%tpu_secret PIN")
    assert type(refused.error).__name__ == "UsageError" and "PIN has 4 characters: a secret needs at least 8" in \
        str(refused.error)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert cell("%tpu_launch v4-8 --name hub").error is None
    run = cell("%%on_tpu\nimport os\nprint(os.environ['HF_TOKEN'])")
    assert run.error is None and run.stdout.strip() == MASK, run.shown
    assert Registry().get_slice("hub") is not None and SECRET.encode() not in (isolated_home / "registry.db").read_bytes()
