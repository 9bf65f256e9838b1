"""Push by relay on real sshd hosts: the kernel sends a value once, the hosts pass it on over an
authenticated link; the result equals a direct push; a relay host that dies fails the push in one
line naming it, and the next push works.
"""
from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from tpunb import manager
from tpunb.engine import connection, relay
from tpunb.engine.transfer import pack
from tpunb.errors import CellInterrupted, HostDiedError
from tpunb.host.relay import NONCE, RelayError, connect_auth
from tests.conftest import interrupt_kernel_when, wait_for
from tests.test_cloud import cloud, tpu_emulator_options  # noqa: F401 - fixtures: emulator nodes on the sshd

pytestmark = pytest.mark.usefixtures("sshd")


@pytest.fixture
def ssh_slice(sshd, ssh_key, monkeypatch):
    """4 real sshd hosts on loopback, JSON frames (as hosts on another Python)."""
    monkeypatch.setattr(connection, "MARSHAL_FRAMES", False)
    monkeypatch.setenv("TPUNB_RELAY", "always")
    monkeypatch.setattr(relay, "FAST_LINK", 0.0)  # stripe on loopback too, as across a slow link
    return manager.connect([f"{a}:{sshd.port}" for a in sshd.addresses], key=str(ssh_key), python=sshd.python)


def _sent_bytes(sl, monkeypatch) -> dict[int, int]:
    """{host: bytes the kernel sends it from now on} (whole frames, and frames sent as head and blob)."""
    sent = {h.index: 0 for h in sl.session.hosts}
    for host in sl.session.hosts:
        send_frame, send_part = host.send_frame, host.send_part

        def counting_frame(data, index=host.index, original=send_frame):
            sent[index] += len(data)
            original(data)

        def counting_part(head, blob=b"", index=host.index, original=send_part):
            sent[index] += len(head) + len(blob)
            original(head, blob)

        monkeypatch.setattr(host, "send_frame", counting_frame)
        monkeypatch.setattr(host, "send_part", counting_part)
    return sent


@pytest.mark.parametrize("fanout", [1, 3])
@pytest.mark.fresh_slice
def test_a_value_pushed_by_relay_equals_the_one_pushed_directly(ssh_slice, monkeypatch, fanout):
    """numpy, nested Python and a cloudpickled closure: a chain (fanout 1) and one relay fanning out."""
    monkeypatch.setattr(relay, "FANOUT", fanout)
    base = 7
    values = {"arr": np.random.default_rng(0).standard_normal(1 << 20),  # 8 MB
              "nested": {"a": [1, (2.5, "x"), {3, 4}], "b": b"\x00\xff" * 1000, "c": None},
              "f": lambda n: n * base + 1}
    monkeypatch.setattr(relay, "STRIPES", 2)  # host 0 and host 1 each get half
    sent = _sent_bytes(ssh_slice, monkeypatch)
    ssh_slice.push({f"r_{k}": v for k, v in values.items()})
    assert max(sent[i] for i in (2, 3)) < 4096 < 4 << 20 < min(sent[0], sent[1])
    assert sent[0] + sent[1] < (8 << 20) + (64 << 10)  # the value crossed SSH once, in two stripes
    monkeypatch.setenv("TPUNB_RELAY", "never")
    ssh_slice.push({f"d_{k}": v for k, v in values.items()})
    check = ("import numpy as np\n(np.array_equal(r_arr, d_arr), r_arr.dtype == d_arr.dtype, r_nested == d_nested, "
             "r_f(3) == d_f(3) == 22)")
    assert ssh_slice.run(check).reprs == {i: "(True, True, True, True)" for i in range(4)}


def test_stripe_trees_cover_every_host_and_spread_the_forwarding():
    forest = relay.trees([[i, "10.0.0.1", 9000 + i] for i in range(16)], 16, 4)
    forwards = dict.fromkeys(range(16), 0)
    for j, tree in enumerate(forest):
        todo, seen = list(tree), []
        forwards[j] += 1  # the root sends its stripe on
        while todo:
            index, _, _, children = todo.pop()
            seen.append(index)
            forwards[index] += bool(children)
            todo.extend(children)
        assert sorted(seen) == [i for i in range(16) if i != j]  # each other host once
    assert set(forwards.values()) == {4}  # every host forwards 4 of the 16 stripes


@pytest.mark.fresh_slice
def test_a_fast_link_takes_one_root_and_a_slow_one_stripes(ssh_slice, monkeypatch):
    """The hosts' first relay_listen times the link; under FAST_LINK one root, over it stripes
    (loopback's time is not asserted: a loaded machine may take it past 25 ms)."""
    monkeypatch.setattr(relay, "FAST_LINK", 0.025)
    ssh_slice.session.relay.listen([0, 1, 2, 3])
    assert ssh_slice.session.relay.round_trip > 0  # timed once, at the first relay_listen
    assert relay.stripes(64 << 20, 4, relay.FAST_LINK / 2) == 1  # a fast link: one root (loopback, unloaded)
    assert relay.stripes(64 << 20, 16, 0.1) == 16 and relay.stripes(64 << 20, 4, 0.1) == 4
    assert relay.stripes(3 << 20, 16, 0.1) == 3 and relay.stripes(1 << 19, 16, 0.1) == 1  # 1 MB or more each


@pytest.mark.fresh_slice
def test_the_kernel_relays_large_values_to_remote_hosts_only(ssh_slice, monkeypatch):
    monkeypatch.delenv("TPUNB_RELAY")
    hosts, size = list(range(4)), relay.MIN_TOTAL // 4
    assert size >= relay.MIN_BYTES and ssh_slice.session.relay.wanted(size, hosts)
    assert not ssh_slice.session.relay.wanted(size - 1, hosts)  # less to send in all: direct
    assert not ssh_slice.session.relay.wanted(relay.MIN_BYTES - 1, hosts[:1] * 64)  # small, however many
    assert not ssh_slice.session.relay.wanted(1 << 30, hosts[:1])  # one host: nothing to pass on
    local = manager.launch("v4-32", name="local")
    assert not local.session.relay.wanted(1 << 30, hosts)  # hosts on this machine: nothing to save


@pytest.mark.fresh_slice
def test_a_peer_without_the_slice_secret_is_refused_and_the_host_keeps_working(ssh_slice):
    address, port = ssh_slice.session.relay.listen([2])[2]
    assert address == ssh_slice.session.hosts[2].transport.host  # its slice-internal address, not 0.0.0.0
    for proof in (b"\x00" * 32, None):  # a wrong proof, and one made with another secret
        with socket.create_connection((address, port), timeout=10) as sock:
            nonce = sock.recv(NONCE)
            if proof is None:
                with pytest.raises(RelayError):
                    connect_auth(sock, secrets.token_bytes(32))
            else:
                sock.sendall(secrets.token_bytes(NONCE) + proof)
                assert sock.recv(64) == b""  # closed without proving itself to us
            assert len(nonce) == NONCE
    with socket.create_connection((address, port), timeout=10) as sock:  # the right secret: both sides proven
        connect_auth(sock, bytes.fromhex(ssh_slice.session.relay.secret))
    ssh_slice.push({"after": np.arange(1 << 20)})
    assert ssh_slice.run("int(after.sum())").reprs == {i: str(sum(range(1 << 20))) for i in range(4)}


@pytest.mark.fresh_slice
def test_the_secret_never_shows(ssh_slice, sshd):
    secret = ssh_slice.session.relay.secret
    shown = ssh_slice.run("import os\nsorted(os.environ.items())").reprs
    assert all(secret not in text for text in shown.values())
    assert secret not in repr(ssh_slice) and secret not in repr(vars(ssh_slice))
    home = os.environ["TPUNB_HOME"]
    for root, _, files in os.walk(home):
        for name in files:
            assert secret.encode() not in open(os.path.join(root, name), "rb").read()


def _read_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return int(f.readline().split()[1])  # rchar


@pytest.mark.fresh_slice
def test_a_value_striped_over_every_host_equals_the_one_pushed_directly(ssh_slice, monkeypatch):
    """Stripes that do not divide the value evenly and cut across its arrays: each host is sent
    about a quarter, and every host ends with the whole value."""
    rng = np.random.default_rng(1)
    values = {"a": rng.integers(0, 255, (16 << 20) + 12345, dtype=np.uint8),
              "b": rng.standard_normal(3 << 17), "c": {"n": [1, "two", (3.0,)]}}
    total = sum(len(s) for s in pack(values))
    assert total % 4 and relay.stripes(total, 4) == 4
    sent = _sent_bytes(ssh_slice, monkeypatch)
    ssh_slice.push({f"r_{k}": v for k, v in values.items()})
    assert all(total // 4 - (1 << 16) < n < total // 4 + (1 << 16) for n in sent.values()), sent
    monkeypatch.setenv("TPUNB_RELAY", "never")
    ssh_slice.push({f"d_{k}": v for k, v in values.items()})
    check = "import numpy as np\n(np.array_equal(r_a, d_a), np.array_equal(r_b, d_b), r_c == d_c)"
    assert ssh_slice.run(check).reprs == {i: "(True, True, True)" for i in range(4)}


def _push_killing(sl, index: int, begun, size: int, what: str) -> str:
    """The one-line error of a push of ``size`` bytes during which host ``index``'s agent is
    killed, once ``begun()``."""
    pid = sl.session.hosts[index].info["pid"]

    def kill() -> None:
        wait_for(begun, 60, what)
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()
    with pytest.raises(HostDiedError) as caught:
        sl.push({"big": np.ones(size, dtype=np.uint8)})
    message = str(caught.value)
    assert "\n" not in message, message
    return message


@pytest.mark.fresh_slice
def test_a_stripe_root_killed_mid_push_fails_it_in_one_line_naming_it(ssh_slice):
    """Host 2 roots the third of four stripes; it is killed while its stripe arrives."""
    victim = ssh_slice.session.hosts[2]
    pid, address = victim.info["pid"], victim.transport.address
    before = _read_bytes(pid)
    message = _push_killing(ssh_slice, 2, lambda: _read_bytes(pid) - before > 8 << 20, 128 << 20,
                            "host 2 to be receiving its stripe")
    assert f"relay host 2 ({address}) died mid-transfer" in message, message
    ssh_slice.push({"big": np.ones(32 << 20, dtype=np.uint8)})  # host 2 restarted, striped again
    assert ssh_slice.run("int(big.sum())").reprs == {i: str(32 << 20) for i in range(4)}


@pytest.mark.fresh_slice
def test_a_relay_host_killed_mid_push_fails_it_in_one_line_naming_it(ssh_slice):
    value = np.ones(64 << 20, dtype=np.uint8)
    root = ssh_slice.session.hosts[0]
    pid, address = root.info["pid"], root.transport.address
    before = _read_bytes(pid)
    killed = {}

    def kill_when_receiving() -> None:
        wait_for(lambda: _read_bytes(pid) - before > 8 << 20, 30, "the relay host to be receiving the value")
        os.kill(pid, signal.SIGKILL)
        killed["at"] = time.perf_counter()

    threading.Thread(target=kill_when_receiving, daemon=True).start()
    with pytest.raises(HostDiedError) as caught:
        ssh_slice.push({"big": value})
    message = str(caught.value)
    assert "\n" not in message and f"relay host 0 ({address})" in message and "mid-transfer" in message, message
    assert time.perf_counter() - killed["at"] < 10  # nothing waited for a timeout
    ssh_slice.push({"big": value[:8 << 20]})  # host 0 restarted, the relay works again
    assert ssh_slice.run("int(big.sum())").reprs == {i: str(8 << 20) for i in range(4)}


def test_a_relay_cut_off_mid_stream_fails_its_subtree_naming_it():
    """Two hosts' relays on real sockets, a chain parent -> 1 -> 2: the parent stops after half the
    value; host 1 says the parent's stream ended, host 2 that host 1's did, neither hangs."""
    from tpunb.host import relay as host_relay

    secret = secrets.token_bytes(32)
    one, two = host_relay.Relay(secret.hex()), host_relay.Relay(secret.hex())
    (a1, p1), (a2, p2) = [(r["address"], r["port"]) for r in (one.listen(), two.listen())]
    tree = [[1, a1, p1, [[2, a2, p2, []]]]]
    children = host_relay.open_children(secret, tree, 5, 4 << 20, [0, "the-root"])
    host_relay.forward(children, memoryview(b"x" * (2 << 20)))
    children[0][1].close()
    with pytest.raises(RelayError, match=r"relay from host 0 \(the-root\) ended after 2,097,152 of 4,194,304"):
        one.wait(5, 10)
    with pytest.raises(RelayError, match=rf"relay from host 1 \({a1}\) ended"):
        two.wait(5, 10)
    assert one.refused == two.refused == 0
    good = host_relay.open_children(secret, tree, 6, 3, [0, "the-root"])  # the next transfer works
    host_relay.forward(good, memoryview(b"abc"))
    assert bytes(one.wait(6, 10)) == bytes(two.wait(6, 10)) == b"abc"
    for child in good:
        child[1].close()


@pytest.mark.fresh_slice
def test_a_cloud_slice_relays_a_large_push_by_itself(cloud, sshd, monkeypatch):
    """A v4-32 from the Cloud TPU emulator (4 sshd hosts), no override: a 4 MB value goes by relay."""
    monkeypatch.delenv("TPUNB_RELAY", raising=False)
    sl = manager.launch("v4-32", name="relayed", backend="gcp")
    sent = _sent_bytes(sl, monkeypatch)
    value = np.arange(1 << 19)  # 4 MB to 4 hosts
    sl.push({"v": value})
    # it crossed the kernel's link once (directly it would cross it 4 times), in as many stripes as
    # the link's measured round trip chose (one on a quiet machine; a loaded one measured more)
    assert value.nbytes < sum(sent.values()) < value.nbytes + (64 << 10), sent
    assert sl.run("int(v.sum())").reprs == {i: str(int(value.sum())) for i in range(4)}
    manager.down("relayed")


@pytest.mark.fresh_slice
def test_hosts_that_cannot_reach_each_other_get_the_value_directly(ssh_slice):
    """Host 2's listener is somewhere host 0 cannot reach: the push still lands everywhere, sent
    directly, and the session stops trying the relay."""
    ssh_slice.session.relay.listen([0, 1, 2, 3])
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = closed.getsockname()[1]  # bound, never listening: connections are refused
        host = ssh_slice.session.hosts[2]
        ssh_slice.session.relay.listeners[2] = (host.info["pid"], ["127.0.0.1", nowhere])
        ssh_slice.push({"v": np.arange(1 << 18)})
    assert ssh_slice.run("int(v.sum())").reprs == {i: str(sum(range(1 << 18))) for i in range(4)}
    assert not ssh_slice.session.relay.wanted(1 << 30, [0, 1, 2, 3])


def _received(address: str, port: int) -> int:
    """Bytes the listener at address:port has received on its open connections (``ss -ti``)."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(n) for n in re.findall(r"bytes_received:(\d+)", out)) if address in out else 0


@pytest.mark.fresh_slice
def test_a_relay_host_inside_the_chain_killed_mid_stream_is_named(ssh_slice, monkeypatch):
    """A chain 0 -> 1 -> 2 -> 3; host 1's agent is killed once it has received 16 MB from host 0:
    one line names host 1, the hosts below it say so rather than wait, and the next push works."""
    monkeypatch.setattr(relay, "FANOUT", 1)
    monkeypatch.setattr(relay, "STRIPES", 1)  # one root, one chain
    address, port = ssh_slice.session.relay.listen([1])[1]
    name = ssh_slice.session.hosts[1].transport.address
    message = _push_killing(ssh_slice, 1, lambda: _received(address, port) > 16 << 20, 256 << 20,
                            "host 1 to be receiving from host 0")
    assert f"relay host 1 ({name}) died mid-transfer" in message, message
    assert "hosts [2, 3] did not get the value" in message, message
    ssh_slice.push({"big": np.ones(4 << 20, dtype=np.uint8)})
    assert ssh_slice.run("int(big.sum())").reprs == {i: str(4 << 20) for i in range(4)}


@pytest.mark.fresh_slice
def test_ctrl_c_stops_a_push_by_relay_within_3_s_and_no_host_dies(ssh_slice):
    root = ssh_slice.session.hosts[0]
    pid, before = root.info["pid"], _read_bytes(root.info["pid"])
    sent = interrupt_kernel_when(lambda: _read_bytes(pid) - before > 32 << 20)
    with pytest.raises(CellInterrupted):
        ssh_slice.push({"big": np.ones(512 << 20, dtype=np.uint8)})
    assert time.perf_counter() - sent["at"] < 3
    assert ssh_slice.session.dead_hosts() == []
    ssh_slice.push({"big": np.ones(2 << 20, dtype=np.uint8)})
    assert ssh_slice.run("int(big.sum())").reprs == {i: str(2 << 20) for i in range(4)}
