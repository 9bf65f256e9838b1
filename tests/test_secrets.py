"""%tpu_secret: values from the kernel's environment on every host, masked (****) in everything
hosts send back (a value split across frames, tracebacks, last_result, service logs), never stored;
HF_TOKEN goes to launched slices without asking; too short a value is refused in one line."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tpunb import manager
from tpunb.engine.masking import MASK, Masker
from tpunb.host.standalone.log_mask import MaskedLog
from tpunb.registry import Registry
from tpunb.secrets.vault import Secrets
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


@pytest.mark.fresh_slice
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
    files = [Path(s.log).read_bytes() for s in sl.services() if s.name == "echo"]  # on the host's disk
    assert len(files) == 2 and all(f"the token is {MASK}".encode() in f and SECRET.encode() not in f for f in files)
    assert SECRET.encode() not in (isolated_home / "registry.db").read_bytes()
    assert cell("%tpu_restart").error is None  # new agents start with it too
    again = cell("%%on_tpu\nimport os\nlen(os.environ['MY_TOKEN'])")
    assert f"Out[0-1]: {len(SECRET)}" in again.shown, again.shown


@pytest.mark.fresh_slice
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


def test_the_supervisor_masks_a_value_split_across_two_writes_before_the_log_file(tmp_path):
    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    masked = MaskedLog(log, [SECRET, "short"])
    os.write(masked.out, f"token={SECRET[:5]}".encode())
    masked.drain()
    assert (tmp_path / "log").read_bytes() == b"token="  # the start of the value is held back
    os.write(masked.out, f"{SECRET[5:]} ok\nends with {SECRET[:4]}".encode())
    masked.drain()
    masked.flush()  # the command ended: a held tail that was no secret goes to the log
    assert (tmp_path / "log").read_bytes() == f"token={MASK} ok\nends with {SECRET[:4]}".encode()
    plain = MaskedLog(log, [])
    assert plain.out == log and plain.read_end is None  # no secret: the command writes the file itself


@pytest.mark.fresh_slice
@pytest.mark.usefixtures("user_defaults")
def test_no_value_on_disk_after_services_restart_and_use_in_a_new_kernel(cell, monkeypatch, isolated_home):
    """A secret and the Hub's token used by cells, a service (its log file read on the host, not
    through tpunb), a restart onto standbys prepared before the secret was set, and %tpu_use after
    a kernel restart (the token again without asking, a secret once named): then no file under
    $TPUNB_HOME (registry, cell logs, the hosts' service logs and compile cache) holds either."""
    hub = "hf_hub_token_ABCDEFGH12345"
    monkeypatch.setenv("HF_TOKEN", hub)
    monkeypatch.setenv("MY_TOKEN", SECRET)
    assert cell("%tpu_launch v4-8 --name vault").error is None
    sl = manager.current()
    sl.standbys.prepare(wait=True)  # agents started before the secret exists
    standbys = wait_for(lambda: (lambda s: s.process.pid if s and s.process else None)(sl.standbys.ready().get(0)),
                        what="a standby")
    assert cell("%tpu_secret MY_TOKEN").error is None
    served = cell("%tpu_serve split -- python3 -c \"import os, sys; v = os.environ['MY_TOKEN']; "
                  "sys.stdout.write('is ' + v[:6]); sys.stdout.flush(); sys.stdout.write(v[6:] + '\\n')\"")
    assert served.error is None, served.shown
    wait_for(lambda: {s.state for s in sl.services() if s.name == "split"} == {"exited"}, what="split to exit")
    log = isolated_home / "services" / "vault" / "host-0" / "split" / "log"
    assert f"is {MASK}\n".encode() in log.read_bytes() and SECRET.encode() not in log.read_bytes()
    assert cell("%tpu_restart").error is None
    assert sl.session.hosts[0].info["pid"] == standbys  # the standby took the host's place, with the secret
    again = cell("%%on_tpu\nimport os\nprint(os.environ['MY_TOKEN'], os.environ['HF_TOKEN'])")
    assert again.stdout.strip() == f"{MASK} {MASK}", again.shown
    manager.detach_all()  # a kernel restart: this kernel's secrets are gone with it
    monkeypatch.setattr(manager.MANAGER, "secrets", {})
    monkeypatch.setattr(manager.MANAGER, "named", Secrets())
    monkeypatch.setattr(manager.MANAGER, "masker", Masker())
    monkeypatch.delenv("MY_TOKEN")  # (local hosts inherit the kernel's environment)
    assert cell("%tpu_use vault").error is None
    probe = "%%on_tpu\nimport os\nprint(os.environ.get('MY_TOKEN', 'unset'), os.environ['HF_TOKEN'])"
    assert cell(probe).stdout.strip() == f"unset {MASK}"  # the token without asking (masked); a secret once named
    monkeypatch.setenv("MY_TOKEN", SECRET)
    assert cell("%tpu_secret MY_TOKEN").error is None
    assert cell(probe).stdout.strip() == f"{MASK} {MASK}"
    found = [p for p in isolated_home.rglob("*") if p.is_file() and (SECRET.encode() in p.read_bytes()
                                                                      or hub.encode() in p.read_bytes())]
    assert not found and (isolated_home / "registry.db").exists() and log.exists()


# -- every form a secret takes in output ------------------------------------------------------------
def _encoded_at_every_offset(value: str) -> list[str]:
    """base64 of user:VALUE, of user:VALUE + newline, and of a JSON object holding it after 0-2 more
    bytes: each byte alignment the value can have inside an encoded stream."""
    import base64
    import json

    texts = [f"user:{value}", f"user:{value}\n"] + [json.dumps({"pad": "x" * n, "token": value}) for n in range(3)]
    return [base64.b64encode(t.encode()).decode() for t in texts]


def test_a_secret_is_masked_in_base64_at_every_alignment_percent_encoded_json_escaped_and_line_by_line():
    import json
    import urllib.parse

    masker = Masker()
    secret = "s3cr3t+/value with space"
    masker.add(secret)
    for encoded in _encoded_at_every_offset(secret):
        shown = masker.text(f"Authorization: Basic {encoded}")
        assert MASK in shown and encoded not in shown, encoded
    url = f"https://example.com/cb?token={urllib.parse.quote(secret, safe='')}&next={urllib.parse.quote_plus(secret)}"
    assert masker.text(url) == f"https://example.com/cb?token={MASK}&next={MASK}"
    key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n  bKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj  \n-----END PRIVATE KEY-----"
    masker.add(key)
    escaped = json.dumps({"private_key": key})  # a service-account file, printed as JSON
    assert "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" not in masker.text(escaped)
    assert masker.text("line: bKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj") == f"line: {MASK}"  # a line of it, trimmed
    assert masker.text("an ordinary sentence, 8 chars+") == "an ordinary sentence, 8 chars+"


def test_the_held_tail_covers_the_longest_form_and_hosts_mask_the_same_forms(tmp_path):
    """A base64 form split across two frames (and two writes on a host) is masked whole: the tail
    held back is as long as the longest form, and the supervisor derives the forms itself from the
    values of the names it is given."""
    import base64

    masker = Masker()
    masker.add(SECRET)
    encoded = base64.b64encode(f"user:{SECRET}".encode()).decode()
    out = masker.frames(0, {"op": "stream", "id": 1, "name": "stdout", "text": "auth " + encoded[:20]})
    out += masker.frames(0, {"op": "stream", "id": 1, "name": "stdout", "text": encoded[20:] + " ok\n"})
    out += masker.frames(0, {"op": "done", "id": 1})
    shown = "".join(f.get("text", "") for f in out)
    assert MASK in shown and encoded[8:30] not in shown and shown.endswith(" ok\n"), shown
    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    written = MaskedLog(log, [SECRET])
    os.write(written.out, ("auth " + encoded[:20]).encode())
    written.drain()
    os.write(written.out, (encoded[20:] + " ok\n").encode())
    written.flush()
    assert (tmp_path / "log").read_text() == masker.text("auth " + encoded + " ok\n")


@pytest.mark.fresh_slice
def test_done_when_a_secret_and_a_secret_looking_env_echoed_by_a_service_are_masked_and_a_setting_is_not(
        cell, monkeypatch):
    """--secret MY_TOKEN (typed at the prompt: no kernel variable) and --env HF_TOKEN=... (a name
    that looks secret: masked, with a hint) echoed by a service, also as base64, are masked in
    %tpu_logs and on the host's disk; --env MODEL=org/name is shown; the listing masks the command."""
    import base64
    import getpass

    typed = "typed_at_the_prompt_0123"
    monkeypatch.delenv("MY_TOKEN", raising=False)
    monkeypatch.setattr(getpass, "getpass", lambda prompt: typed)  # the user typing: the one thing not real here
    sl = manager.launch("v4-8", name="masked")
    run = cell(f"%tpu_serve echo --env HF_TOKEN={SECRET} MODEL=org/name --secret MY_TOKEN -- "
               "echo $HF_TOKEN $MODEL $MY_TOKEN; echo user:$MY_TOKEN | base64; echo " + SECRET)
    assert run.error is None, run.shown
    assert "--env HF_TOKEN looks secret: masked, but the value is in this cell" in run.stderr and \
        "give --secret HF_TOKEN or %tpu_secret instead" in run.stderr, run.stderr
    assert manager.secret_value("MY_TOKEN") == typed  # what %tpu_fetch reads
    wait_for(lambda: {s.state for s in sl.services() if s.name == "echo"} == {"exited"}, what="echo to exit")
    logs = cell("%tpu_logs echo").stdout
    encoded = base64.b64encode(f"user:{typed}\n".encode()).decode()
    assert f"{MASK} org/name {MASK}" in logs and SECRET not in logs and typed not in logs, logs
    assert encoded[:8] in logs and encoded[8:28] not in logs, logs  # only the base64 of "user:" shows
    [on_disk] = [Path(s.log).read_text() for s in sl.services() if s.name == "echo"]
    assert SECRET not in on_disk and typed not in on_disk and "org/name" in on_disk
    assert cell(f"%tpu_serve literal -- echo {SECRET}").error is None
    listing = cell("%tpu_serve").stdout
    assert f"echo {MASK}" in listing and SECRET not in listing, listing
    assert not cell("%tpu_serve plain --env MODEL=org/name -- true").stderr  # a setting: no hint


@pytest.mark.fresh_slice
def test_hf_token_goes_to_a_launch_by_default_said_in_one_line_and_no_hf_token_keeps_it(cell, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    run = cell("%tpu_launch v4-8 --name given")
    assert run.error is None and "'given' has this kernel's HF_TOKEN as a secret (masked)" in run.stdout, run.shown
    assert "--no-hf-token leaves it out" in run.stdout
    assert manager.MANAGER.env["given"]["HF_TOKEN"] == SECRET  # what the hosts are sent (local hosts also
    kept = cell("%tpu_launch v4-8 --name kept --no-hf-token")  # inherit this process's environment)
    assert kept.error is None and "HF_TOKEN" not in kept.stdout, kept.shown
    assert "HF_TOKEN" not in manager.MANAGER.env["kept"] and not Registry().get_slice("kept").spec["hf_token"]
    manager.detach_all()  # a new kernel: the record says the launch kept it out
    assert cell("%tpu_use kept").error is None and "HF_TOKEN" not in manager.MANAGER.env["kept"]
    assert cell("%tpu_use given").error is None and manager.MANAGER.env["given"]["HF_TOKEN"] == SECRET


@pytest.mark.fresh_slice
def test_no_presigned_signature_in_any_output(cell, monkeypatch):
    """A presigned URL fetched: its query is in no output (the success line, a failure) and is
    masked in whatever hosts print while and after it runs."""
    from tpunb.sandbox.hub.hub_server import Hub, HubServer

    signature = "X-Amz-Signature=5f1d0c0ffee0ddba11deadbeefcafe42&X-Amz-Expires=3600"
    with HubServer(Hub()) as hub:
        hub.hub.add_repo("org/signed", {"w.bin": b"weights" * 100})
        manager.launch("v4-8", name="signed")
        url = f"{hub.url}/org/signed/resolve/main/w.bin?{signature}"
        run = cell(f"%tpu_fetch {url} --to ~/signed")
        assert run.error is None and f"{hub.url}/org/signed/resolve/main/w.bin at ~/signed" in run.stdout, run.shown
        missing = cell(f"%tpu_fetch {hub.url}/org/signed/resolve/main/absent.bin?{signature} --to ~/signed")
        echoed = cell(f"%%on_tpu\nprint({url!r})")
    for said in (run, missing, echoed):
        assert "5f1d0c0ffee0ddba11deadbeefcafe42" not in said.shown + str(said.error), said.shown
    assert MASK in echoed.stdout
