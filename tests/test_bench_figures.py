"""%tpu_bench's figures against a server whose delays are known, as vllm bench serve would read
them: the toy server with vLLM's block prefix cache (blocks of 16 tokens from the first, TTFT =
20 ms + 0.3 ms per uncached token), a reasoning model, Poisson arrivals without a cap, and the
files a sweep saves, compared with files vLLM v0.34.0's own code wrote (tests/fixtures/vllm_bench)."""
from __future__ import annotations

import csv
import json
import uuid
from pathlib import Path

import pytest

import tpunb
from tests.conftest import ACCELERATOR_FOR_HOSTS
from tests.test_bench_serving import toy, toy_command  # noqa: F401 - fixture
from tests.test_serve import free_port, no_service_left  # noqa: F401 - autouse fixture
from tpunb import manager
from tpunb.bench.bench_result import EXTRA_KEYS, LISTS

pytestmark = pytest.mark.sandbox
VLLM = Path(__file__).parent / "fixtures" / "vllm_bench" / "sweep"
#: the toy's prefill: 20 ms, and 0.3 ms for each prompt token its prefix cache does not hold
BASE_MS, PER_TOKEN_MS = 20.0, 0.3


def uncached(tokens: int) -> float:
    return BASE_MS + PER_TOKEN_MS * tokens


@pytest.mark.fresh_slice
def test_done_when_a_sweep_measures_prefill_not_the_prefix_cache(cell, tmp_path):
    """On a 2-host slice, the toy as a service with vLLM's prefix cache and no reset route: 40
    requests of 1024 tokens at concurrency 1 then 4. Every prompt is distinct, in every level, so
    the median TTFT is the uncached one at both (prompts resent at the second level read 24 ms).
    The client runs on the service's host by default."""
    manager.launch(ACCELERATOR_FOR_HOSTS[2], name=f"prefill-{uuid.uuid4().hex[:6]}")
    port = free_port()
    command = toy_command(port, ttft=BASE_MS / 1000, itl=0.002, prefix_cache="", prefill_ms_per_token=PER_TOKEN_MS)
    assert cell(f"%tpu_serve toy --hosts 0 --wait-http {port}/health -- {command}").error is None
    saved = tmp_path / "sweep"
    run = cell(f"%tpu_bench toy --requests 40 --concurrency 1,4 --input-len 1024 --output-len 2 --save {saved}")
    assert run.error is None, run.shown
    assert "on its host" in run.stdout and "so its prefix cache was not reset" in run.stdout, run.stdout
    for c in (1, 4):
        level = json.loads((saved / f"BENCH--max_concurrency={c}" / "run=0.json").read_text())
        assert level["completed"] == 40 and level["input_lens"] == [1024] * 40 and level["on_host"]
        assert abs(level["median_ttft_ms"] - uncached(1024)) <= 0.1 * uncached(1024), (c, level["median_ttft_ms"])


def test_done_when_a_shared_prefix_is_half_cached(toy):
    """--prefix-len 512 of 1024: every request after the first finds the shared 512 tokens (32
    blocks) in the cache, so the median TTFT is the half-cached one; the server saw it so."""
    server = toy(ttft=BASE_MS / 1000, itl=0.002, prefix_cache=True, prefill_per_token=PER_TOKEN_MS / 1000)
    level = tpunb.bench_serving(server.url, requests=12, input_len=512, prefix_len=512, output_len=2).levels[0]
    assert level["completed"] == 12 and level["input_lens"] == [1024] * 12
    assert server.prefills[-12:] == [(1024, 0)] + [(1024, 512)] * 11
    assert abs(level["median_ttft_ms"] - uncached(512)) <= 0.1 * uncached(512), level["median_ttft_ms"]


def test_the_prefix_cache_is_reset_before_each_level_where_the_server_exposes_it_and_warmups_are_not_measured(toy):
    server = toy(ttft=0.01, itl=0.002, prefix_cache=True, prefill_per_token=0.0001, dev_mode=True)
    result = tpunb.bench_serving(server.url, requests=4, concurrency="1,2", input_len=32, prefix_len=16,
                                 output_len=2, num_warmups=2)
    assert [level["prefix_cache"] for level in result.levels] == ["reset", "reset"]
    # each level: a cold cache, its warm-ups (two at once at concurrency 2) cache the level's prefix,
    # its measured requests find it
    assert [held for _, held in server.prefills] == [0, 16, 16, 16, 16, 16] + [0, 0, 16, 16, 16, 16]
    prompts = [r.get("prompt") for r in server.requests]
    assert len(set(prompts)) == len(prompts) == 12  # warm-ups drawn apart from the measured prompts
    assert [level["completed"] for level in result.levels] == [4, 4] and result.levels[0]["warmups"] == 2


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_a_reasoning_model_has_its_first_token_at_the_first_chunk_and_its_true_tpot(toy, field):
    """The first 8 of 16 tokens come as reasoning: TTFT is the first chunk (50 ms, not the first
    answer at 130 ms), TPOT the true 10 ms; the first answer is its own column, and without a usage
    chunk the reasoning text counts too."""
    server = toy(ttft=0.05, itl=0.01, reasoning=8, reasoning_field=field, usage=False)
    result = tpunb.bench_serving(server.url, requests=3, input_len=8, output_len=16, chat=True)
    level = result.levels[0]
    assert abs(level["median_ttft_ms"] - 50) < 10 and abs(level["median_tpot_ms"] - 10) < 1.5, level
    assert abs(level["median_ttfat_ms"] - 130) < 12 and level["output_lens"] == [16] * 3
    assert [len(itls) for itls in level["itls"]] == [15] * 3  # the opening role chunk is no token
    assert "median first answer ms" in result.frame().columns


def test_a_request_rate_without_concurrency_has_no_cap_and_a_cap_shows_its_queue(toy):
    """20 requests at 20 a second take a second plus one request (the last arrives at N / rate),
    not twenty requests in a row; with --concurrency 1 they queue, and the queue time is reported."""
    server = toy(ttft=0.1, itl=0.01)
    level = tpunb.bench_serving(server.url, requests=20, request_rate=20.0, input_len=4, output_len=4).levels[0]
    one = level["median_e2el_ms"] / 1000
    assert level["max_concurrency"] is None and level["max_concurrent_requests"] >= 2
    assert 1.0 <= level["duration"] <= 1.0 + one + 0.3, (level["duration"], one)
    assert "median_client_queue_time_ms" not in level
    capped = tpunb.bench_serving(server.url, requests=8, request_rate=20.0, concurrency=1, input_len=4,
                                 output_len=4).levels[0]
    assert capped["duration"] >= 8 * one and capped["max_concurrent_requests"] == 1
    assert capped["median_client_queue_time_ms"] > 100 and len(capped["queue_times"]) == 8
    assert capped["median_e2el_including_client_queue_ms"] > capped["median_e2el_ms"] + 100


def test_goodput_counts_requests_within_every_limit(toy):
    server = toy(ttft=0.05, itl=0.01)
    level = tpunb.bench_serving(server.url, requests=4, concurrency=4, input_len=4, output_len=4,
                                goodput="ttft:500 tpot:50").levels[0]
    assert level["request_goodput"] == pytest.approx(level["request_throughput"])
    level = tpunb.bench_serving(server.url, requests=4, concurrency=4, input_len=4, output_len=4,
                                goodput=["ttft:10"]).levels[0]
    assert level["request_goodput"] == 0


def test_a_sharegpt_file_gives_the_prompts_and_their_answers_lengths(toy, tmp_path):
    conversations = [{"conversations": [{"from": "human", "value": f"question {i} " + "word " * (4 + i)},
                                        {"from": "gpt", "value": "answer " * (5 + i)}]} for i in range(6)]
    conversations.append({"conversations": [{"from": "human", "value": "one turn only"}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    server = toy(ttft=0.01, itl=0.001)
    level = tpunb.bench_serving(server.url, requests=6, input_len=4, dataset=str(path), seed=1).levels[0]
    asked = {r["prompt"]: r["max_tokens"] for r in server.requests}
    assert sorted(asked.values()) == [5, 6, 7, 8, 9, 10]  # each answer's length, in the server's tokens
    assert all(int(p.split()[1]) + 5 == n for p, n in asked.items()) and level["completed"] == 6


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_done_when_a_saved_sweep_has_vllms_layout_and_keys(toy, tmp_path):
    """The same sweep vLLM v0.34.0's own code ran (8 random prompts at concurrency 1 and 4,
    tests/fixtures/vllm_bench/make.py), saved by tpunb: the same files, every key vLLM wrote
    (tpunb's own only from EXTRA_KEYS), the same per-request lists, itls a list per request."""
    server = toy(ttft=0.02, itl=0.005, prefix_cache=True, dev_mode=True)
    ours = tmp_path / "sweep"
    tpunb.bench_serving(server.url, requests=8, concurrency="1,4", input_len=32, output_len=4, save=ours)
    assert _files(ours) == _files(VLLM)
    for run in (p for p in _files(VLLM) if p.endswith(".json")):
        theirs, mine = json.loads((VLLM / run).read_text()), json.loads((ours / run).read_text())
        for a, b in zip(*(x if isinstance(x, list) else [x] for x in (theirs, mine))):
            assert set(a) <= set(b), f"{run}: vLLM's keys tpunb lacks: {sorted(set(a) - set(b))}"
            assert set(b) - set(a) <= set(EXTRA_KEYS), f"{run}: keys of neither: {sorted(set(b) - set(a) - set(EXTRA_KEYS))}"
            for key in LISTS:
                assert len(a[key]) == len(b[key]) == a["num_prompts"] == b["num_prompts"], (run, key)
            assert [len(itl) for itl in b["itls"]] == [n - 1 for n in b["output_lens"]]
            assert (b["run_number"], b["max_concurrency"], b["request_rate"]) == (a["run_number"], a["max_concurrency"],
                                                                                  a["request_rate"])
    header = lambda path: next(csv.reader(path.open()))  # noqa: E731
    assert set(header(VLLM / "summary.csv")) <= set(header(ours / "summary.csv"))
