"""%tpu_bench and tpunb.bench_serving against real OpenAI-style servers on 127.0.0.1 (the toy server
with known delays, in this process or as a service of a local or SSH slice), in a real IPython shell."""
from __future__ import annotations

import json
import socket
import statistics
import sys
import threading
import time
import urllib.parse
import uuid

import pytest

import tpunb
from tests.conftest import ACCELERATOR_FOR_HOSTS, CPU_AS_TPU_HOST, interrupt_kernel_when
from tests.test_serve import PYTHON, free_port, no_service_left  # noqa: F401 - autouse fixture
from tpunb import manager
from tpunb.engine import connection
from tpunb.host.standalone import toy_llm
from tpunb.host.standalone.toy_llm import Behaviour, ToyLLM

TOY = toy_llm.__file__


@pytest.fixture
def toy():
    """toy(**behaviour) -> a ToyLLM serving on a thread here (closed after the test)."""
    made = []

    def start(**behaviour):
        made.append(ToyLLM(Behaviour(**behaviour)).start())
        return made[-1]

    yield start
    for server in made:
        server.close()


def toy_command(port: int, python: str = PYTHON, **flags) -> str:
    extra = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in flags.items())
    return f"{python} {TOY} --port {port} {extra}"


def received(server: ToyLLM) -> list[float]:
    return sorted(s.t for s in server.log if s.kind == "received")


@pytest.mark.fresh_slice
def test_done_when_bench_a_service_on_a_local_slice(cell, tmp_path):
    """12 requests at concurrency 1 of 16 tokens, first after 300 ms, then every 20 ms: from the
    kernel (--from-kernel) the round trip it measured is in each TTFT and shown beside the figures;
    by default a service is measured from its own host."""
    sl = manager.launch(ACCELERATOR_FOR_HOSTS[1], name=f"bench-{uuid.uuid4().hex[:6]}")
    port, saved = free_port(), tmp_path / "bench.json"
    run = cell(f"%tpu_serve toy --wait-http {port}/health -- {toy_command(port, ttft=0.3, itl=0.02)}")
    assert run.error is None, run.shown
    assert [(s.name, s.port) for s in sl.services()] == [("toy", port)]
    run = cell(f"%tpu_bench toy --requests 12 --concurrency 1 --output-len 16 --from-kernel --save {saved}")
    assert run.error is None, run.shown
    figures = json.loads(saved.read_text())
    assert figures["completed"] == 12 and figures["failed"] == 0 and figures["total_output_tokens"] == 12 * 16
    rtt = figures["rtt_ms"]
    assert rtt is not None and f"round trip {rtt:.2f} ms, in every TTFT" in run.stdout and not figures["on_host"]
    assert abs(figures["median_ttft_ms"] - (300 + rtt)) <= 0.1 * (300 + rtt), figures["median_ttft_ms"]
    assert abs(figures["median_tpot_ms"] - 20) <= 2, figures["median_tpot_ms"]
    assert {"mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "request_throughput", "output_throughput"} <= set(figures)

    on_host = tpunb.bench_serving("toy", requests=3, output_len=4, input_len=8)
    assert on_host.on_host and on_host.rtt_ms is None and on_host.levels[0]["completed"] == 3
    assert on_host.levels[0]["total_input_tokens"] == 3 * 8  # counted by the server's /tokenize, in its tokens

    sl.serve("quiet", "sleep 60", port=port + 1)  # --port alone records where it answers
    assert {s.name: s.port for s in sl.services()}["quiet"] == port + 1
    sl.serve("portless", "sleep 60")
    for line, says in [("%tpu_bench portless", "service 'portless' has no port: start it with %tpu_serve portless --port P"),
                       ("%tpu_bench nosuch", "no service named 'nosuch'"),
                       ("%tpu_serve bad --port 70000 -- true", "--port is a number from 1 to 65535, not 70000"),
                       ("%tpu_bench toy --host 3", "3"),
                       ("%tpu_bench toy --requests 2 --tokenizer /no/such/dir", "--tokenizer /no/such/dir: no such file")]:
        run = cell(line)
        assert type(run.error).__name__ == "UsageError", (line, run.shown)
        assert says in str(run.error) and "\n" not in str(run.error), (line, str(run.error))


@pytest.mark.fresh_slice
def test_through_a_forward_to_an_ssh_host_which_is_closed_afterwards(sshd, ssh_key, monkeypatch):
    monkeypatch.setattr(connection, "MARSHAL_FRAMES", False)
    sl = manager.connect([f"{sshd.addresses[0]}:{sshd.port}"], key=str(ssh_key), python=sshd.python,
                        name=f"bench-{uuid.uuid4().hex[:6]}", accelerator=ACCELERATOR_FOR_HOSTS[1], env=CPU_AS_TPU_HOST)
    port = free_port()
    sl.serve("toy", toy_command(port, python=sshd.python, ttft=0.05, itl=0.005), wait_port=port)
    result = tpunb.bench_serving("toy", requests=4, concurrency="2", output_len=4, input_len=4, chat=True,
                                 on_host=False)
    assert result.levels[0]["completed"] == 4 and result.rtt_ms is not None
    used = urllib.parse.urlsplit(result.url).port
    assert used != port  # a forward of our own, not the host's port
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", used), timeout=5).close()
    assert sl.forwards == []


@pytest.mark.parametrize("behaviour, requests, kinds, completed", [
    ({"fail": 503, "fail_every": 2}, 4, {"HTTP 503": 2}, 2),
    ({"fail": 404}, 3, {"HTTP 404": 3}, 0),
    ({"malformed": True}, 2, {"malformed": 2}, 0),
    ({"stall": True}, 2, {"timeout": 2}, 0),
])
def test_each_failure_kind_is_counted_and_the_run_ends(toy, behaviour, requests, kinds, completed):
    server = toy(ttft=0.01, itl=0.005, **behaviour)
    result = tpunb.bench_serving(server.url, requests=requests, output_len=4, input_len=4, timeout=0.5)
    level = result.levels[0]
    assert level["failures"] == kinds and level["completed"] == completed
    assert level["failed"] == requests - completed and len(level["errors"]) == requests
    assert result.frame().loc[1, "failures"] == ", ".join(f"{k}: {n}" for k, n in kinds.items())


def test_the_api_key_from_the_environment_is_sent_and_never_shown(toy, cell, monkeypatch):
    server = toy(ttft=0.01, itl=0.002, api_key="sk-toy-4f8a91c2")
    level = tpunb.bench_serving(server.url, model="toy", requests=2, output_len=2, input_len=2).levels[0]
    assert level["failures"] == {"HTTP 401": 2}
    monkeypatch.setenv("OPENAI_API_KEY", "sk-toy-4f8a91c2")
    run = cell(f"%tpu_bench {server.url} --requests 2 --output-len 2 --input-len 3")
    assert run.error is None and "sk-toy" not in run.shown, run.shown
    assert "failed" not in run.stderr and len(server.requests) == 2  # the 401s never reached a completion
    result = tpunb.bench_serving(server.url, requests=2, output_len=2, input_len=3)
    assert result.levels[0]["completed"] == 2 and result.levels[0]["input_lens"] == [3, 3]  # /tokenize got it too
    assert result.rtt_ms is not None and "sk-toy" not in result.to_json()


def test_without_kernel_stamps_reads_are_stamped_when_the_loop_wakes(toy, monkeypatch):
    """TLS or another OS: the asyncio Protocol path, with the same figures."""
    from tpunb.host.standalone import bench_client

    monkeypatch.setattr(bench_client, "KERNEL_STAMPS", False)
    server = toy(ttft=0.05, itl=0.01)
    level = tpunb.bench_serving(server.url, requests=4, concurrency=2, output_len=4, input_len=2).levels[0]
    assert level["completed"] == 4 and level["output_lens"] == [4] * 4
    assert abs(level["median_ttft_ms"] - 50) < 10 and abs(level["median_tpot_ms"] - 10) < 2


def test_a_prompt_longer_than_a_socket_buffer_is_sent_whole(toy):
    server = toy(ttft=0.01, itl=0.001)
    level = tpunb.bench_serving(server.url, requests=2, input_len=100_000, output_len=2).levels[0]
    assert level["completed"] == 2 and level["input_lens"] == [100_000, 100_000]
    assert [len(r["prompt"].split()) for r in server.requests] == [100_000, 100_000]


def test_a_refused_connection_is_counted_and_failures_are_shown_per_kind(cell):
    port = free_port()  # nothing listens
    run = cell(f"%tpu_bench 127.0.0.1:{port} --model m --requests 3 --input-len 4 --output-len 4")
    assert run.error is None, run.shown
    assert f"concurrency 1: 3 of 3 failed (3 refused); first: connection refused by 127.0.0.1:{port}" in run.stderr


def test_without_a_usage_chunk_output_tokens_are_the_text_counted_and_the_output_ignores_eos(toy):
    server = toy(ttft=0.01, itl=0.002, usage=False)
    level = tpunb.bench_serving(server.url, requests=3, output_len=7, input_len=5).levels[0]
    assert level["completed"] == 3 and level["output_lens"] == [7, 7, 7] and level["input_lens"] == [5, 5, 5]
    assert level["generated_texts"] == [" t0 t1 t2 t3 t4 t5 t6"] * 3  # counted by the server's /tokenize
    asked = server.requests[0]
    assert (asked["max_tokens"], asked["min_tokens"], asked["ignore_eos"]) == (7, 7, True)
    assert asked["stream"] and asked["stream_options"] == {"include_usage": True} and asked["model"] == "toy"
    assert "temperature" not in asked  # the server's default, as vllm bench serve leaves it
    tpunb.bench_serving(server.url, requests=1, output_len=3, input_len=2, ignore_eos=False, temperature=0.7)
    assert "ignore_eos" not in server.requests[-1] and "min_tokens" not in server.requests[-1]
    assert server.requests[-1]["temperature"] == 0.7


def test_input_len_counts_the_tokens_of_a_tokenizer_given(toy, tmp_path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz [")}
    made = Tokenizer(models.WordLevel(vocab, unk_token="["))
    made.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")  # a token per character
    made.decoder = decoders.Fuse()
    made.save(str(tmp_path / "tokenizer.json"))
    server = toy(ttft=0.01, itl=0.002)
    result = tpunb.bench_serving(server.url, requests=3, input_len=40, output_len=2, tokenizer=str(tmp_path))
    assert [len(r["prompt"]) for r in server.requests] == [40, 40, 40]
    assert len({r["prompt"][:16] for r in server.requests}) == 3  # their first blocks differ: a prefix cache has none
    alphabet = "abcdefghijklmnopqrstuvwxyz ["  # vLLM's random dataset: each a run of the vocabulary from an offset
    assert all(alphabet[(alphabet.index(p[0]) + 1) % 28] == p[1] for p in (r["prompt"] for r in server.requests))
    assert result.levels[0]["completed"] == 3
    (tmp_path / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(tpunb.UsageError, match=r"^--tokenizer .*: cannot read it \("):
        tpunb.bench_serving(server.url, requests=1, tokenizer=str(tmp_path / "tokenizer.json"))


@pytest.fixture
def raw_server():
    """raw_server(answer) -> the port of a server that answers a completion with ``answer`` and
    closes (anything else: 404): framings the toy server does not use. Closed after the test."""
    listeners = []
    yield lambda answer: serve_raw(answer, listeners)
    for listener in listeners:
        listener.close()


def serve_raw(answer: bytes, listeners: list) -> int:
    listener = socket.create_server(("127.0.0.1", 0))
    listeners.append(listener)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed
            with conn:
                asked = conn.recv(65536)
                conn.sendall(answer if b"/v1/completions" in asked else
                             b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


EVENTS = (b'data: {"id": "r1", "choices": [{"text": " a"}]}\n\ndata: {"id": "r1", "choices": [{"text": " b"}]}\n\n'
          b'data: {"id": "r1", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2}}\n\ndata: [DONE]\n\n')


@pytest.mark.parametrize("answer, kinds", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(EVENTS), EVENTS), {}),
    (b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + EVENTS, {}),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(EVENTS[:40]), EVENTS[:40]),
     {"disconnected": 1}),
    (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", {"malformed": 1}),
])
def test_every_framing_is_read_and_a_cut_stream_is_counted(raw_server, answer, kinds):
    level = tpunb.bench_serving(f"127.0.0.1:{raw_server(answer)}", model="m", requests=1, input_len=2,
                                output_len=2, timeout=10).levels[0]
    assert level["failures"] == kinds, level["errors"]
    if not kinds:
        assert level["output_lens"] == [2] and level["input_lens"] == [2] and len(level["itls"]) == 1


def test_a_sweep_saves_one_run_per_level_and_plots_or_says_why_not(toy, cell, tmp_path, monkeypatch):
    server = toy(ttft=0.05, itl=0.005)
    saved = tmp_path / "sweep"
    result = tpunb.bench_serving(server.url, requests=4, concurrency="1,4", output_len=4, input_len=4, save=saved)
    entries = [json.loads((saved / f"BENCH--max_concurrency={c}" / "run=0.json").read_text()) for c in (1, 4)]
    assert [(e["max_concurrency"], e["completed"]) for e in entries] == [(1, 4), (4, 4)]
    assert list(result.frame().index) == [1, 4]
    done = sorted(s.t for s in server.log if s.kind == "done")
    assert sum(t < done[4] for t in received(server)[4:]) == 4  # level 4: all four arrived before one ended
    assert sum(t < done[0] for t in received(server)[:4]) == 1  # level 1: one at a time
    import matplotlib.pyplot as plt

    ax = result.plot()  # latency against throughput, a point per level
    assert [line.get_label() for line in ax.get_lines()] == ["median TTFT", "median TPOT"]
    assert list(ax.get_lines()[0].get_xdata()) == [e["output_throughput"] for e in entries]
    assert list(ax.get_lines()[0].get_ydata()) == [e["median_ttft_ms"] for e in entries]
    plt.close(ax.figure)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # matplotlib missing: the table alone
    run = cell(f"%tpu_bench {server.url} --requests 2 --concurrency 1,2 --output-len 2 --input-len 2")
    assert run.error is None and "no plot: matplotlib is not installed" in run.stdout, run.shown
    table = "".join(o.data.get("text/plain", "") for o in run.outputs)
    assert "completed" in table and "median queue ms" in table and "[2 rows x 19 columns]" in table, table


def test_arrivals_follow_the_rate_on_vllms_schedule(toy):
    """Gaps drawn from a gamma distribution (burstiness 1: exponential), scaled so the last request
    arrives at N / rate, as vllm's get_request; burstiness 4 evens them out."""
    from tpunb.host.standalone.bench_client import arrivals

    server = toy(ttft=0.01, itl=0.002)
    start = time.perf_counter()
    tpunb.bench_serving(server.url, requests=6, concurrency=6, request_rate=20.0, output_len=2, input_len=2, seed=3)
    times = received(server)[-6:]
    schedule = arrivals(6, 20.0, 1.0, 3)
    assert schedule[-1] == pytest.approx(6 / 20.0)
    assert all(abs((b - a) - (y - x)) < 0.03 for a, b, x, y in zip(times, times[1:], schedule, schedule[1:])), \
        (times, schedule, start)
    even, bursty = arrivals(200, 10.0, 4.0, 1), arrivals(200, 10.0, 0.25, 1)
    spread = lambda t: statistics.pstdev([b - a for a, b in zip(t, t[1:])])  # noqa: E731
    assert even[-1] == pytest.approx(20.0) and spread(even) < 0.1 < spread(bursty)


def test_ctrl_c_stops_a_stalled_run_cleanly(toy, cell):
    server = toy(ttft=0.01, itl=0.005, stall=True)
    interrupt_kernel_when(lambda: any(s.kind == "token" for s in server.log) or len(received(server)) >= 2)
    run = cell(f"%tpu_bench {server.url} --requests 2 --output-len 4 --input-len 2")
    assert type(run.error).__name__ == "CellInterrupted" and "\n" not in str(run.error), run.shown
    assert run.seconds < 20


@pytest.mark.parametrize("line, says", [
    ("%tpu_bench", "the following arguments are required: target"),
    ("%tpu_bench 'not a target!'", "is not a service name of the current slice, HOST:PORT or a base URL"),
    ("%tpu_bench 127.0.0.1:8000 --concurrency 0", "--concurrency is C or C1,C2,... with each C >= 1"),
    ("%tpu_bench 127.0.0.1:8000 --concurrency 1,x", "--concurrency is C or C1,C2,..."),
    ("%tpu_bench 127.0.0.1:8000 --requests 0", "--requests is a whole number >= 1, not 0"),
    ("%tpu_bench 127.0.0.1:8000 --output-len -1", "--output-len is a whole number >= 1, not -1"),
    ("%tpu_bench 127.0.0.1:8000 --request-rate 0", "--request-rate is requests per second > 0"),
    ("%tpu_bench 127.0.0.1:8000 --timeout 0", "--timeout is seconds > 0"),
    ("%tpu_bench 127.0.0.1:8000 --requests many", "argument --requests: invalid int value: 'many'"),
    ("%tpu_bench 127.0.0.1:8000 --on-host", "--on-host and --host pick the host of a service"),
    ("%tpu_bench http://127.0.0.1:8000/v1 --host 0", "--on-host and --host pick the host of a service"),
    ("%tpu_bench toy", "no slice yet"),
    ("%tpu_bench 127.0.0.1:1", "give --model M: http://127.0.0.1:1/ did not list its models"),
    ("%tpu_bench 127.0.0.1:8000 --burstiness 0", "--burstiness is a number > 0 (1: Poisson arrivals)"),
    ("%tpu_bench 127.0.0.1:8000 --prefix-len -1", "--prefix-len is a whole number >= 0, not -1"),
    ("%tpu_bench 127.0.0.1:8000 --num-warmups -2", "--num-warmups is a whole number >= 0, not -2"),
    ("%tpu_bench 127.0.0.1:8000 --goodput ttft=5", "--goodput takes KEY:MS pairs with KEY one of ttft, tpot, e2el"),
    ("%tpu_bench 127.0.0.1:8000 --goodput itl:5", "--goodput takes KEY:MS pairs"),
    ("%tpu_bench 127.0.0.1:8000 --dataset /no/such.json", "--dataset /no/such.json: cannot read it"),
    ("%tpu_bench toy --on-host --from-kernel", "--on-host and --from-kernel pick opposite places"),
    ("%tpu_bench 127.0.0.1:8000 --save /", "--save / is a folder: one level is saved as a file"),
])
def test_bad_input_is_one_line_with_what_to_do(cell, line, says):
    run = cell(line)
    assert run.error is not None and says in str(run.error), run.shown
    assert "\n" not in str(run.error) and "Traceback" not in run.shown
