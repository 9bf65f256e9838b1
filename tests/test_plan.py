"""The planner against published worked figures.

Sources:
  [hf]      Hugging Face model pages / config.json (parameter counts they display), and the
            Gemma 3 Technical Report (arXiv:2503.19786) Table 1 for the Gemma 3 split.
  [book]    Austin et al., "How to Scale Your Model" (jax-ml/scaling-book): part 2 (tpus.md),
            part 4 (transformers.md), part 5 (training.md), part 6 (applied-training.md,
            "Training LLaMA 3 on TPUs"), part 8 (applied-inference.md, "Serving LLaMA 3-70B").
  [dstack]  dstack blog "Using TPUs for fine-tuning and deploying LLMs" (2024-09-10), serving
            memory table: 8B/70B/405B need 16/140/810 GB in bf16 (v5litepod-4/16/64), 8/70/405 GB in int8.
  [peft]    Hugging Face PEFT print_trainable_parameters for Llama 3 8B, LoRA r=8 on q_proj and
            v_proj: "trainable params: 3,407,872 || all params: 8,033,669,120".
"""
from __future__ import annotations

import json

import pytest

from tpunb.catalog import lookup
from tpunb.errors import TpunbError, UsageError
from tpunb.plan import (
    ModelSpec, Plan, Serving, Training, fsdp_min_tokens_per_chip, fsdp_tp_split, lora_params,
    max_tensor_parallel, mixed_min_tokens_per_chip, parse_count, plan, preset, presets,
)

V5P = lookup("v5p-8")


@pytest.mark.parametrize(
    "name, published",
    [  # [hf] the count each model page shows
        ("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 406e9),
        ("llama3.2-1b", 1.24e9), ("llama3.2-3b", 3.21e9), ("llama2-7b", 6.74e9), ("llama2-13b", 13.0e9),
        ("mistral-7b", 7.24e9), ("mixtral-8x7b", 46.7e9),
        ("gemma2-2b", 2.61e9), ("gemma2-9b", 9.24e9), ("gemma2-27b", 27.2e9),
        ("gemma3-1b", 1.0e9), ("gemma3-4b", 4.3e9), ("gemma3-12b", 12.2e9), ("gemma3-27b", 27.4e9),
    ],
)
def test_parameter_counts_match_published(name, published):
    assert preset(name).params == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("name, non_embedding", [("gemma3-1b", 698e6), ("gemma3-4b", 3209e6), ("gemma3-12b", 10759e6), ("gemma3-27b", 25600e6)])
def test_gemma3_non_embedding_params(name, non_embedding):
    assert preset(name).non_embedding_params == pytest.approx(non_embedding, rel=0.005)  # [hf] Gemma 3 report


def test_mixtral_active_params():
    assert preset("mixtral-8x7b").active_params == pytest.approx(12.9e9, rel=0.01)  # [hf] Mistral AI


def test_every_preset_cites_a_source():
    for name in presets():
        assert preset(name).source


def test_book_parameter_counts():
    # [book] part 6: 56.3e9 FFW + 2.1e9 vocab + 12e9 attention = 70.4e9 (norms ignored)
    llama70 = preset("llama3-70b").breakdown()
    assert llama70["mlp"] == pytest.approx(56.3e9, rel=0.01)
    assert llama70["embedding"] + llama70["unembedding"] == pytest.approx(2.1e9, rel=0.01)
    assert llama70["attention"] == pytest.approx(12e9, rel=0.01)
    assert preset("llama3-70b").params == pytest.approx(70.4e9, rel=0.01)
    # [book] part 5 problem 1: LLaMA-2 13B = 8.5e9 FFW + 4.2e9 attention + 0.3e9 vocab = 13.1e9
    assert preset("llama2-13b").params == pytest.approx(13.1e9, rel=0.01)


def test_config_dict_and_file(tmp_path):
    config = {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000}
    path = tmp_path / "mistral" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    for source in (config, str(path), str(path.parent)):
        assert plan(source, tpu="v5e").params == pytest.approx(7.24e9, rel=0.01)  # [hf] Mistral 7B
    nested = {"model_type": "gemma3", "text_config": dict(preset_config("gemma3-27b"))}
    assert ModelSpec.from_config(nested).non_embedding_params == pytest.approx(25.6e9, rel=0.005)


def preset_config(name):
    from tpunb.plan.models import model_table

    return model_table()["models"][name]["config"]


def test_kv_cache_per_token():
    # [book] part 8: LLaMA 3-70B int8 KV = 2 * 8 * 128 * 80 = 160 KiB per token; 5.3 GB per 32k sequence
    llama70 = preset("llama3-70b")
    assert llama70.kv_bytes_per_token("int8") == 160 * 1024
    assert llama70.kv_bytes_per_token("int8") * 32768 == pytest.approx(5.3e9, rel=0.02)
    # [book] part 4 problem 1: L=64, N*H = D = 4096, MHA, int8: 2 * 64 * 4096 = 512 kB per token
    toy = ModelSpec("toy", layers=64, d_model=4096, d_ff=16384, heads=32, kv_heads=32, head_dim=128, vocab=32000)
    assert toy.kv_bytes_per_token("int8") == 512 * 1024


def test_llama3_70b_training_budget():
    # [book] part 6: 4M-token batches, bf16 params, fp32 Adam, 3 checkpoints of d_model per layer.
    # Sequence 1024 keeps attention FLOPs (which the book leaves out) under 2%.
    p = plan("llama3-70b", batch_tokens=4e6, seq_len=1024, tokens=15e12, remat=3, tpu="v5p")
    assert p.memory.params == pytest.approx(140e9, rel=0.02)
    assert p.memory.optimizer == pytest.approx(560e9, rel=0.02)
    assert p.memory.activations == pytest.approx(15.8e12, rel=0.01)
    assert p.memory.total == pytest.approx(16.5e12, rel=0.02)
    assert p.memory.total / 96e9 == pytest.approx(171, rel=0.02)  # "we need 171 TPUs"
    assert p.dense_flops_per_token == pytest.approx(4.2e11, rel=0.01)  # 6 * 70e9
    assert p.total_flops == pytest.approx(6.3e24, rel=0.03)
    # "train on a full TPU v5p pod with 16x20x28 = 8960 chips at 40% MFU: about 44 days"
    pod = p.on("v5p", topology="16x20x28")
    assert pod.chips == 8960
    assert pod.total_seconds / 86400 == pytest.approx(44, rel=0.03)
    # "roughly 2048-way FSDP and 4-way model parallelism"
    assert pod.mesh.tensor == 4
    assert pod.mesh.data * pod.mesh.fsdp == 8960 // 4


def test_llama3_70b_two_pods():
    # [book] part 5: 16M tokens over ~18,823 v5p chips ("roughly 2 pods") at 50% MFU trains LLaMA-3
    # 70B in about 17 days. Two real pods are 17,920 chips (20x28x32): 17 * 18823 / 17920 days.
    p = plan("llama3-70b", batch_tokens=16e6, seq_len=1024, tokens=15e12, mfu=0.5, tpu="v5p")
    two_pods = p.on("v5p", topology="20x28x32")
    assert two_pods.bound == "compute"
    assert two_pods.total_seconds / 86400 == pytest.approx(17 * 18823 / 17920, rel=0.03)


def test_llama2_13b_memory():
    # [book] part 5 problem 2: (2 + 4 + 4) * 13e9 ~ 130 GB of params + Adam; checkpoints after the
    # three FFW matmuls: 2 * L * B * (D + 2F) ~ 42 TB at 16M tokens; 7.86e12 at 3M
    p = plan("llama2-13b", batch_tokens=16e6, seq_len=4096, remat="ffw", tpu="v5p")
    assert p.memory.params + p.memory.optimizer == pytest.approx(130e9, rel=0.01)
    assert p.memory.activations == pytest.approx(42e12, rel=0.01)
    p3 = plan("llama2-13b", batch_tokens=3e6, seq_len=32768, remat="ffw", tpu="v5p")
    assert p3.memory.activations == pytest.approx(7.86e12, rel=0.01)


def test_book_sharding_formulas():
    # [book] part 5: pure FSDP over 3 axes needs 850 tokens/chip, so 3M on 4096 chips is comms-bound
    assert fsdp_min_tokens_per_chip(V5P, axes=3) == pytest.approx(850, rel=0.01)
    assert fsdp_min_tokens_per_chip(V5P, axes=3) * 4096 == pytest.approx(3.48e6, rel=0.01)
    # mixed FSDP + TP floor 2 * 2550^2 / F: 940 for LLaMA-2 13B, 453 for LLaMA 3-70B
    assert mixed_min_tokens_per_chip(13824, V5P) == pytest.approx(940, rel=0.01)
    assert mixed_min_tokens_per_chip(28672, V5P) == pytest.approx(453, rel=0.01)
    # TP is ICI-bound beyond F / 2550 = 11 ways for LLaMA 3-70B
    assert max_tensor_parallel(28672, V5P) == pytest.approx(11, rel=0.03)
    # optimal FSDP size: v5p 4x4x4, F=32768, B=48000 -> X = 31.7; LLaMA 3-70B on 8960 chips -> 1927
    assert fsdp_tp_split(48000, 32768, 64, V5P) == pytest.approx(31.7, rel=0.01)
    assert fsdp_tp_split(4.19e6, 28672, 8960, V5P) == pytest.approx(1927, rel=0.01)


def test_llama2_13b_pure_fsdp_is_ici_bound():
    # [book] part 5 problem 3: 3M tokens, 32k sequences, 4096 v5p chips: pure FSDP is comms-bound
    p = plan("llama2-13b", batch_tokens=3e6, seq_len=32768, remat="ffw", tpu="v5p")
    cube = p.on("v5p", topology="16x16x16")
    assert cube.chips == 4096
    # 3e6 / 4096 = 732 tokens per chip, under the book's 850 floor: the planner must not pick pure
    # FSDP (every chip on the fsdp axis), and says why with the book's numbers
    assert cube.mesh.fsdp < cube.chips and cube.mesh.data * cube.mesh.fsdp * cube.mesh.tensor == 4096
    assert "732 tokens/chip vs FSDP floor α/axes 850" in cube.reason
    assert cube.fits


@pytest.mark.parametrize(
    "model, memory_gb, v5e_slice",
    [("llama3-8b", 16e9, "v5litepod-4"), ("llama3-70b", 140e9, "v5litepod-16"), ("llama3-405b", 810e9, "v5litepod-64")],
)
def test_dstack_serving_table_bf16(model, memory_gb, v5e_slice):
    p = plan(model, "serve", weight_dtype="bf16", batch=1, context=4096, tpu="v5e")  # MAX_TOTAL_TOKENS=4096
    assert p.memory.params == pytest.approx(memory_gb, rel=0.02)
    assert p.options[0].accelerator == v5e_slice


@pytest.mark.parametrize("model, memory_gb", [("llama3-8b", 8e9), ("llama3-70b", 70e9), ("llama3-405b", 405e9)])
def test_dstack_serving_table_int8(model, memory_gb):
    assert plan(model, "serve", weight_dtype="int8", tpu="v5e").memory.params == pytest.approx(memory_gb, rel=0.02)


@pytest.mark.parametrize("dtype, chips", [("bf16", 16), ("int8", 8), ("int4", 4)])
def test_book_smallest_v5e_slice_for_llama70b(dtype, chips):
    # [book] part 8: smallest slice, batch 1, 8k context: bf16 4x4, int8 4x2, int4 2x2
    p = plan("llama3-70b", "serve", weight_dtype=dtype, batch=1, context=8192, tpu="v5e")
    assert p.options[0].chips == chips


def test_book_decode_latency_when_hbm_is_full():
    # [book] part 8: with the batch filling HBM, each step loads ~16 GB per v5e at 8.2e11 B/s: 19 ms
    probe = plan("llama3-70b", "serve", weight_dtype="int8", context=8192, tpu="v5litepod-8")
    full = plan("llama3-70b", "serve", weight_dtype="int8", context=8192, batch=probe.options[0].max_batch, tpu="v5litepod-8")
    assert full.options[0].fits
    assert full.options[0].step_seconds == pytest.approx(0.019, rel=0.05)
    assert full.options[0].bound == "HBM bandwidth"


def test_book_sampling_latency_bound():
    # [book] part 2 problem 1: 200B params in bf16 on 32 TPU v4: loading them takes ~10 ms per step
    p = plan("200B", "serve", batch=1, context=128, tpu="v4-64")
    assert p.options[0].chips == 32
    assert p.options[0].step_seconds == pytest.approx(0.010, rel=0.05)


def test_lora_trainable_params():
    assert lora_params(preset("llama3-8b"), 8, ("q", "v")) == 3_407_872  # [peft]
    p = plan("llama3-8b", lora_rank=8, batch_tokens="32K", seq_len=2048, tpu="v5e")
    assert p.trainable_params + p.params == 8_033_669_120
    assert p.memory.optimizer == pytest.approx(3_407_872 * 8)


def test_bare_parameter_count():
    p = plan("7B", tpu="v5p")
    assert p.params == 7e9
    assert p.model.estimated and any("estimated" in n for n in p.notes)


def test_cost_and_time_follow_the_slice():
    p = plan("llama3-8b", batch_tokens="1M", seq_len=8192, tokens="10B", tpu="v6e")
    best = p.best()
    assert best.total_seconds == pytest.approx(10e9 / 1e6 * best.step_seconds)
    assert best.cost_usd == pytest.approx(best.total_seconds / 3600 * best.usd_per_hour)
    assert best.spot_cost_usd < best.cost_usd
    table = p.table()
    assert table.loc[best.accelerator, "cost_usd"] == pytest.approx(best.cost_usd)


def test_deadline_picks_a_bigger_slice():
    relaxed = plan("llama3-8b", batch_tokens="1M", seq_len=8192, tokens="100B", tpu="v6e")
    rushed = plan("llama3-8b", batch_tokens="1M", seq_len=8192, tokens="100B", tpu="v6e", deadline="2d")
    assert rushed.options[0].chips > relaxed.options[0].chips
    assert rushed.options[0].total_seconds <= 2 * 86400


def test_a_deadline_is_a_duration_with_a_unit_or_seconds():
    args = dict(batch_tokens="1M", seq_len=8192, tokens="100B", tpu="v6e")
    assert plan("llama3-8b", deadline=2 * 86400, **args).deadline_seconds == 2 * 86400  # a number: seconds
    assert plan("llama3-8b", deadline="1d12h", **args).deadline_seconds == 36 * 3600
    with pytest.raises(UsageError, match=r"deadline takes a duration with a unit, not '36': use 90s, 30m, 2h or 1d$"):
        plan("llama3-8b", deadline="36", **args)  # hours to some, seconds to others: refused


def test_every_generation_is_compared():
    p = plan("gemma2-9b", batch_tokens="1M", seq_len=4096, tokens="1B")
    assert {o.generation for o in p.options} == {"v2", "v3", "v4", "v5e", "v5p", "v6e", "tpu7x"}
    assert all(o.fits for o in p.options)
    assert "cheapest" in str(p) and "<table>" in p._repr_html_()


def test_usage_errors_are_one_line():
    for call in (
        lambda: plan("llama3-8x"),
        lambda: plan("llama3-8b", batch_tokens="1Q"),
        lambda: plan("llama3-8b", optimiser="adamw"),
        lambda: plan("llama3-8b", "serve", weight_dtype="int3"),
        lambda: plan("llama3-8b", "sample"),
    ):
        with pytest.raises(TpunbError) as info:
            call()
        assert "\n" not in str(info.value)
    assert "did you mean 'optimizer'" in str(pytest.raises(UsageError, plan, "llama3-8b", optimiser="adamw").value)


def test_parse_count():
    assert parse_count("1M") == 1e6 and parse_count("2^20") == 2**20 and parse_count("1Mi") == 2**20
    assert parse_count("7B") == 7e9 and parse_count(4096) == 4096


def test_workload_objects():
    p = plan("llama3-8b", Serving(weight_dtype="int8", batch=8), tpu="v6e")
    assert isinstance(p, Plan) and p.workload.kv_cache_dtype == "int8"
    assert plan("llama3-8b", Training(batch_tokens=2**18, seq_len=2048), tpu="v5e").workload.seq_len == 2048


def test_tpu_plan_magic():
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "tpunb")
    p = ip.run_line_magic("tpu_plan", "llama3-70b --serve --weights int8 --batch 1 --context 8192 --tpu v5e")
    assert p.options[0].chips == 8
    p = ip.run_line_magic("tpu_plan", "gemma2-2b --lora 16 --batch 64K --seq 2048 --tokens 100M --tpu v6e")
    assert p.workload.lora_rank == 16
    for bad, text in (("llama3-8b --serve --seq 4", "--seq applies to training"), ("llama3-8b --frob", "unrecognized"), ("", "required")):
        with pytest.raises(UsageError, match=text):
            ip.run_line_magic("tpu_plan", bad)
