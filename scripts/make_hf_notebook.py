"""Writes notebooks/10_hf_finetune_serve.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_hf_notebook.py"""
import os

from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import IGNORE, write

PORT = 18100  # the server's port on host 0 (08_serve uses 18000 and 18080; local hosts share this machine's ports)

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_tutorial")


def source(name: str) -> str:
    """A cell's code, kept in scripts/hf_tutorial/ as a file of its own (tests read the notebook's copy)."""
    with open(os.path.join(HERE, name)) as kept:
        return kept.read().rstrip("\n")


MAKE_MODEL = source("make_model.py")
LLAMA = source("llama.py")
SERVER = source("server.py")

LOAD = (
    "%%on_tpu\nimport json, os, sys\n\n"
    "import jax, jax.numpy as jnp, numpy as np, optax\n"
    "from huggingface_hub import snapshot_download\n"
    "from jax.sharding import AxisType, NamedSharding, PartitionSpec as P\n"
    "from tokenizers import Tokenizer\n\n"
    "sys.path.insert(0, work)\nimport llama\n\n"
    'folder = snapshot_download("tutorial/tiny-llama", local_files_only=True)   # where %tpu_fetch put it\n'
    'mesh = jax.make_mesh((jax.process_count(), jax.local_device_count()), ("data", "model"),\n'
    "                     axis_types=(AxisType.Auto,) * 2)   # hosts x chips\n"
    "config, weights = llama.load(folder, mesh)   # two shards, bf16 on disk, float32 here\n"
    'q = weights["model.layers.0.self_attn.q_proj.weight"]\n'
    "frozen = sum(w.size for w in {id(w): w for w in weights.values()}.values())   # lm_head is the embedding\n"
    "print(f\"{os.path.relpath(folder, os.environ['HF_HOME'])}: {len(weights)} tensors, {frozen:,} parameters, \"\n"
    "      f\"head_dim {llama.head_dim(config)}, rope {config['rope_scaling']['rope_type']}\")\n"
    'print(f"q_proj {q.shape} is split {q.sharding.spec} over {mesh.devices.size} devices: "\n'
    '      f"this host holds {len(q.addressable_shards)} pieces of {q.addressable_shards[0].data.shape}")'
)

FINETUNE_SETUP = (
    "%%on_tpu\nimport jinja2\n\n"
    'RANK, ALPHA, TARGETS = 8, 16, ("q_proj", "v_proj")   # PEFT\'s default targets for a Llama\n'
    "SEQ, BATCH = 64, 16\n"
    "host, hosts = jax.process_index(), jax.process_count()\n"
    'tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")\n'
    'special = json.load(open(f"{folder}/tokenizer_config.json"))\n'
    'template = jinja2.Environment().from_string(special["chat_template"])   # as vLLM renders a chat\n'
    'EOT = tokenizer.token_to_id(special["eos_token"])\n\n'
    "def example(said, answer):\n"
    '    """A chat through the tokenizer\'s template: the tokens, and which of them the loss counts (the answer\'s)."""\n'
    '    asked = [{"role": "user", "content": said}]\n'
    '    prompt = template.render(messages=asked, bos_token=special["bos_token"], add_generation_prompt=True)\n'
    '    chat = template.render(messages=asked + [{"role": "assistant", "content": answer}], bos_token=special["bos_token"])\n'
    "    encoded = tokenizer.encode(chat)\n"
    "    ids = (encoded.ids + [EOT] * (SEQ + 1))[: SEQ + 1]\n"
    "    learned = [start >= len(prompt) for start, _ in encoded.offsets] + [False] * (SEQ + 1)\n"
    "    return ids, learned[1 : SEQ + 1]   # a token is learned where the next one is the answer\'s\n\n"
    "# chat turns from the play: a speech, and the speech that answers it; each host takes its own share\n"
    'speeches = [part.strip() for part in text.split("\\n\\n") if part.strip()]\n'
    "mine = [example(said, answer) for said, answer in list(zip(speeches, speeches[1:]))[host::hosts]]\n\n"
    "def adapter(key, name):\n"
    '    """A [r, in] small and random, B [out, r] zero (so training starts from the base model), each split\n'
    '    over "model" as the layer they adapt is."""\n'
    '    out, inp = weights[f"{name}.weight"].shape\n'
    "    a = jax.random.uniform(key, (RANK, inp), minval=-1, maxval=1) / np.sqrt(inp)\n"
    "    column = name.endswith(llama.COLUMNS)\n"
    '    return (jax.device_put(a, NamedSharding(mesh, P() if column else P(None, "model"))),\n'
    '            jax.device_put(jnp.zeros((out, RANK)), NamedSharding(mesh, P("model", None) if column else P())))\n\n'
    'names = [llama.module(i, t) for i in range(config["num_hidden_layers"]) for t in TARGETS]\n'
    "lora = {name: adapter(key, name) for name, key in zip(names, jax.random.split(jax.random.key(1), len(names)))}\n\n"
    "def loss_fn(lora, x, y, learned):\n"
    "    scaled = {name: (a, b, ALPHA / RANK) for name, (a, b) in lora.items()}\n"
    "    losses = optax.softmax_cross_entropy_with_integer_labels(llama.forward(config, weights, scaled, x), y)\n"
    "    return (losses * learned).sum() / jnp.maximum(learned.sum(), 1)   # the answers\' tokens only\n\n"
    "optimizer = optax.adam(3e-2)\n"
    "opt_state = optimizer.init(lora)\n"
    "opt_state = jax.tree.map(lambda a: a if a.ndim else jax.device_put(a, NamedSharding(mesh, P())), opt_state)\n\n"
    "@jax.jit\n"
    "def step(lora, opt_state, x, y, learned):   # gradients for the adapters only: the base weights are constants\n"
    "    loss, grads = jax.value_and_grad(loss_fn)(lora, x, y, learned)\n"
    "    updates, opt_state = optimizer.update(grads, opt_state)\n"
    "    return optax.apply_updates(lora, updates), opt_state, loss\n\n"
    'batch_sharding = NamedSharding(mesh, P("data"))   # each host feeds its own rows\n'
    "def batch(i):\n"
    "    rows = np.random.default_rng([i, host]).integers(0, len(mine), BATCH // hosts)\n"
    "    ids = np.array([mine[r][0] for r in rows], np.int32)\n"
    "    learned = np.array([mine[r][1] for r in rows], np.float32)\n"
    "    return [jax.make_array_from_process_local_data(batch_sharding, a) for a in (ids[:, :-1], ids[:, 1:], learned)]\n\n"
    "trained = sum(a.size + b.size for a, b in lora.values())\n"
    'print(f"{len(mine)} chats on this host, e.g. {len(mine[0][0])} tokens of which {sum(mine[0][1])} are learned")\n'
    'print(f"LoRA trains {trained:,} parameters on {len(names)} layers; the {frozen:,} of the base model stay frozen")'
)

FINETUNE = (
    "%%on_tpu\nhistory = []\n"
    "for i in range(30):\n"
    "    lora, opt_state, loss = step(lora, opt_state, *batch(i))\n"
    "    history.append(float(loss))\n"
    "    if i % 10 == 0 or i == 29:\n"
    '        print(f"step {i:2}: loss {history[-1]:.3f}")\n'
    "assert np.mean(history[-5:]) < history[0] - 0.3, history"
)

SAVE = (
    "%%on_tpu\nfrom jax.experimental import multihost_utils\nfrom safetensors.numpy import save_file\n\n"
    "whole = multihost_utils.process_allgather(lora, tiled=True)   # every process takes part; each gets numpy\n"
    'adapter_dir = os.path.join(work, "adapter")\n'
    "if host == 0:\n"
    "    os.makedirs(adapter_dir, exist_ok=True)\n"
    "    tensors = {}\n"
    "    for name, (a, b) in whole.items():   # PEFT's names: base_model.model. + the module + .lora_A.weight\n"
    '        tensors[f"base_model.model.{name}.lora_A.weight"] = np.asarray(a, np.float32)\n'
    '        tensors[f"base_model.model.{name}.lora_B.weight"] = np.asarray(b, np.float32)\n'
    '    save_file(tensors, f"{adapter_dir}/adapter_model.safetensors", metadata={"format": "pt"})\n'
    '    json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": "tutorial/tiny-llama",\n'
    '               "r": RANK, "lora_alpha": ALPHA, "lora_dropout": 0.0, "target_modules": list(TARGETS),\n'
    '               "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "modules_to_save": None,\n'
    '               "use_rslora": False, "use_dora": False}, open(f"{adapter_dir}/adapter_config.json", "w"), indent=1)\n'
    '    print(sorted(os.listdir(adapter_dir)))'
)

CHECK = (
    "%%on_tpu\nimport re\nfrom safetensors import safe_open\n\n"
    "if host == 0:   # where the adapter was written\n"
    '    settings = json.load(open(f"{adapter_dir}/adapter_config.json"))\n'
    '    print({key: settings[key] for key in ("peft_type", "r", "lora_alpha", "target_modules")})\n'
    '    with safe_open(f"{adapter_dir}/adapter_model.safetensors", "numpy") as f:\n'
    "        saved = sorted(f.keys())\n"
    "        for name in saved[:4]:\n"
    '            print(f"{name:60} {f.get_slice(name).get_shape()}")\n'
    '        print(f"... {len(saved)} tensors, metadata {f.metadata()}")\n'
    '    pattern = r"base_model\\.model\\.model\\.layers\\.\\d+\\.self_attn\\.(q|v)_proj\\.lora_[AB]\\.weight"\n'
    "    assert len(saved) == 2 * len(names) and all(re.fullmatch(pattern, name) for name in saved), saved"
)

FORWARD = f"url = %tpu_forward {PORT}\nurl"

ASK = (
    "import json, urllib.request\n\n\n"
    "def post(path, body):\n"
    "    return urllib.request.urlopen(urllib.request.Request(\n"
    '        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=60)\n\n\n'
    'print([m["id"] for m in json.load(urllib.request.urlopen(url + "v1/models", timeout=60))["data"]])\n'
    'for model in ("tutorial/tiny-llama", "coriolanus"):\n'
    '    request = {"model": model, "prompt": "MENENIUS:\\n", "max_tokens": 16, "temperature": 0.8, "seed": 0}\n'
    '    with post("v1/completions", request) as answer:\n'
    '        print(f"{model:20} {json.load(answer)[\'choices\'][0][\'text\']!r}")'
)

CHAT = (
    'body = {"model": "coriolanus", "messages": [{"role": "user", "content": "Who are you?"}], "max_tokens": 8,\n'
    '        "temperature": 0.8, "seed": 0, "stream": True, "stream_options": {"include_usage": True}}\n'
    'with post("v1/chat/completions", body) as answer:\n'
    "    for line in answer:\n"
    '        if line.startswith(b"data: "):\n'
    "            event = line[6:].strip()\n"
    '            if event == b"[DONE]":\n'
    "                print(event.decode())\n"
    "                continue\n"
    "            event = json.loads(event)\n"
    '            print(event["usage"] if event.get("usage") else repr(event["choices"][0]["delta"]["content"]))'
)

#: the real model of the v6e-8 path: a Llama 3.2 instruct model, as the loader and vLLM's LoRA both take it
#: (LlamaForCausalLM; its checkpoint sharded in two, bf16, rope_scaling llama3, tied embeddings)
REAL_MODEL = "meta-llama/Llama-3.2-3B-Instruct"

#: the real-slice path, one command per line: tests/test_hf_real_path.py runs them on the sandbox
REAL_PATH = [
    '%tpu_launch v6e-8 --zone us-east5-b --name llama --pip "safetensors tokenizers jinja2"',
    "%tpu_secret HF_TOKEN",
    f'%tpu_fetch hf://{REAL_MODEL} --exclude "original/*"',
    "%tpu_push work text\n%tpu_sync $work $work",
    f'# the cells above from "Load it sharded" on, with snapshot_download("{REAL_MODEL}", local_files_only=True,\n'
    '# ignore_patterns=["original/*"]) and llama.load(folder, mesh, dtype=jnp.bfloat16), then SAVE with\n'
    "# adapter_dir = ~/adapters/mine",
    "%tpu_restart --no-jax",
    "%%tpu_run\nUV=$(command -v uv || echo ~/.local/bin/uv)   # the uv that made tpunb's environment\n"
    "$UV venv ~/vllm-env --python 3.12                 # vllm-tpu's wheels are for 3.12, its jax pins stay here\n"
    "VIRTUAL_ENV=~/vllm-env $UV pip install vllm-tpu",
    f"%tpu_serve vllm --wait-http 8000/health --timeout 1800 -- ~/vllm-env/bin/vllm serve {REAL_MODEL} "
    "--tensor-parallel-size 8 --max-model-len 4096 --enable-lora --max-lora-rank 8 "
    "--lora-modules mine=$HOME/adapters/mine --port 8000",
    "%tpu_bench vllm --model mine --chat --concurrency 1,16,64 --input-len 1024 --output-len 128 --on-host",
]

VLLM = (
    "## The same on a real v6e-8, with vLLM\n\n"
    "`vllm serve` answers the same routes, and `--enable-lora --lora-modules NAME=PATH` serves the adapter "
    f"beside its base model, under its own name, from exactly the folder saved above. The model is `{REAL_MODEL}`: "
    "a Llama like the toy (the loader above reads its two bf16 shards, its `llama3` rope scaling and its tied "
    "embeddings), gated (ask for access on its Hub page first), and one whose LoRA vLLM serves. On a Cloud TPU "
    "v6e-8 (one host, 8 chips):\n\n"
    "```\n" + "\n".join(REAL_PATH) + "\n```\n\n"
    "Step by step:\n\n"
    "- `--exclude \"original/*\"` leaves out Meta's own checkpoint, which would double the download; the model lands "
    "in each host's Hugging Face cache, where `snapshot_download(..., local_files_only=True)` and `vllm serve "
    f"{REAL_MODEL}` find it without downloading again (give `snapshot_download` the same `ignore_patterns`: the "
    "Hub's listing, kept beside the files, tells it the repository holds more).\n"
    "- Fine-tune in bf16 (`llama.load(folder, mesh, dtype=jnp.bfloat16)`, the adapters in float32), through the "
    "tokenizer's own chat template as above: a real instruct model's template is Llama 3's, the one the toy copies.\n"
    "- `%tpu_restart --no-jax` frees the chips: the agent that fine-tuned holds the TPU (only one process can), "
    "and `vllm serve` could not open it; a plain restart would start JAX again, and hold it again.\n"
    "- vllm-tpu goes into an environment of its own (its wheels are for Python 3.12, and it pins its own jax and "
    "libtpu); tpunb's environment keeps the kernel's jax. The `vllm/vllm-tpu` docker image works too: see "
    "`08_serve.ipynb`, which mounts the host's Hugging Face cache into it.\n"
    "- `--max-lora-rank` must be at least the adapter's `r`; `$HOME` (not `~`) in `--lora-modules`, which no shell "
    "expands inside an argument.\n"
    "- `--on-host` (the default for a service) runs the benchmark's client on the host, beside the server: figures "
    "without the round trip from this notebook to the slice.\n\n"
    "The first start compiles for minutes; the compile cache (`VLLM_XLA_CACHE_PATH`, set on every host) makes the "
    "next start after `%tpu_restart` fast, and `%tpu_launch --compile-cache gs://BUCKET/PATH` keeps it across "
    "slices."
)

cells = [
    new_markdown_cell(
        "# A Hugging Face model: fetch, LoRA fine-tune, serve, benchmark\n\n"
        "The path most TPU work walks: bring a model from the Hugging Face Hub with a token, fine-tune it with "
        "LoRA, serve it with the adapter behind an OpenAI-style API, and measure time to first token and "
        "throughput. At toy scale, on a simulated **v4-16 (2 hosts x 4 chips)**:\n\n"
        "1. make a tiny Llama 3 in Hugging Face's format (`config.json`, `tokenizer.json` with a chat template, "
        "two bf16 safetensors shards and their index) and publish it;\n"
        "2. `%tpu_fetch` it into every host's Hugging Face cache: one download per slice, not one per host;\n"
        "3. load it **sharded** over the slice's 8 devices and LoRA-fine-tune it in JAX on chats rendered by its "
        "chat template;\n"
        "4. save the adapter in PEFT's layout, the one `vllm serve --lora-modules` reads;\n"
        "5. serve base model and adapter with `%tpu_serve`, and sweep them with `%tpu_bench`.\n\n"
        "**What stands in for the Hub here:** `tpunb.sandbox.hub.hub_server`, a local server that speaks the Hub's HTTP API "
        "(the tree listing, `resolve` with LFS redirects, gated repositories that answer 401 without a token) to "
        "the real `huggingface_hub` client; it is not a mock that accepts anything. **On a real slice** skip the "
        "stand-in cell: launch with `%tpu_launch v4-16 --zone us-central2-b` (or a v6e-8), give your token with "
        "`%tpu_secret HF_TOKEN` (from the environment, Colab's secrets or a prompt; it never appears in outputs) "
        "and fetch `hf://ORG/NAME` of a real model (the last section has the whole real path). The hosts need "
        "`safetensors`, `tokenizers` and `jinja2` too: `%tpu_launch ... --pip \"safetensors tokenizers jinja2\"`."),
    new_markdown_cell(
        "A local slice's hosts share this machine's home: `HF_HOME` gives them a Hugging Face cache of their own "
        "in this tutorial's folder (`--env` is for settings like this one, never for secrets). On a real slice "
        "each host has its own disk and cache (`~/.cache/huggingface`), and nothing needs setting."),
    new_code_cell('%load_ext tpunb\nimport os, tempfile\n\nwork = tempfile.mkdtemp(prefix="tpunb-hf-")   # the same path on '
                  'the hosts\n%tpu_launch v4-16 --name hf --env HF_HOME=$work/hf'),
    new_markdown_cell(
        "## A tiny Llama 3 in Hugging Face's format\n\n"
        "A byte-level BPE tokenizer trained on Coriolanus with the `tokenizers` package (with Llama 3's chat "
        "markers and its chat template in `tokenizer_config.json`), a `config.json` as `transformers` writes one "
        "for Llama 3.2 (`rope_scaling` of type `llama3`, no `head_dim`, tied embeddings, bf16), and the weights "
        "under Llama's names (`model.layers.0.self_attn.q_proj.weight`, ...) in two shards with their index: a "
        "real checkpoint has the same files, only larger."),
    new_code_cell(MAKE_MODEL),
    new_markdown_cell(
        "## Publish it, and fetch it to every host\n\n"
        "Start the Hub stand-in and put the files in a **gated** repository, which answers only with a token. "
        "On the real Hub you would upload them (`huggingface_hub.upload_folder`) or use a published model; the "
        "stand-in serves downloads only, so the notebook hands it the files. `HF_ENDPOINT` points "
        "`huggingface_hub` (and `%tpu_fetch`) at it, as it would at a Hub mirror. The token is made up here; "
        "`%tpu_secret` puts it in the hosts' environment and masks it in everything they print."),
    new_code_cell(
        "from tpunb.sandbox.hub.hub_server import Hub, HubServer\n\n"
        'os.environ["HF_TOKEN"] = "hf_" + secrets.token_hex(16)   # a real slice: your own token, never in a cell\n'
        'hub = HubServer(Hub(tokens=(os.environ["HF_TOKEN"],)))   # the Hub stand-in, on free loopback ports\n'
        'os.environ["HF_ENDPOINT"] = hub.url\n'
        "published = {name: open(os.path.join(made, name), 'rb').read() for name in os.listdir(made)}\n"
        'commit = hub.hub.add_repo("tutorial/tiny-llama", published, gated=True)\n'
        "%tpu_secret HF_TOKEN"),
    new_markdown_cell(
        "`%tpu_fetch` lists the repository in the kernel, then **one** host downloads each file and relays it "
        "to the others as it lands, so the bytes leave the Hub once per slice (every host running "
        "`huggingface_hub` itself would download them once per host). Files are checked against the Hub's "
        "hashes and land in each host's Hugging Face cache in `huggingface_hub`'s own layout, where "
        "`from_pretrained`, `snapshot_download` and `vllm serve` look (`--to PATH` puts them in a folder instead, "
        "as `hf download --local-dir` does). A local slice's hosts share this machine's disk, so the files are "
        "written once:"),
    new_code_cell("%tpu_fetch hf://tutorial/tiny-llama"),
    new_markdown_cell("A second fetch finds them there and moves nothing:"),
    new_code_cell("%tpu_fetch hf://tutorial/tiny-llama"),
    new_markdown_cell(
        "## Load it sharded over the slice\n\n"
        "The model's code lives in a file, so that both the cells on the hosts and the server import it: a "
        "Llama forward pass in plain JAX over a dict of Hugging Face's tensors (RMSNorm, rotary embeddings with "
        "Llama 3's frequency scaling, grouped-query attention, a SwiGLU MLP), with LoRA on any linear layer, and a "
        "loader that reads what real Llama 3 checkpoints hold: the shards their index names, bf16, `head_dim` "
        "derived when absent, the output tied to the embedding. `tests/test_hf_loader.py` checks its logits "
        "against `transformers`' on this very model."),
    new_code_cell("%%writefile {work}/llama.py\n" + LLAMA),
    new_code_cell("%tpu_push work text\n%tpu_sync $work $work"),
    new_markdown_cell(
        "A mesh of hosts x chips: `data` across the 2 hosts, `model` across each host's 4 chips. The attention "
        "and MLP matrices are split over `model` as Megatron splits them (q, k, v, gate, up by output rows; o and "
        "down by input columns), and `jax.make_array_from_callback` asks `safetensors` for just the slices a "
        "host's own devices hold. No chip holds the whole model: here each host's 4 chips share one copy and the "
        "2 hosts train on different data; on a slice whose `model` axis spans hosts, each host reads only its part "
        "of the file."),
    new_code_cell(LOAD),
    new_markdown_cell(
        "## LoRA fine-tuning\n\n"
        "Each adapted layer gains `A` (r x in) and `B` (out x r, zeros at first) and computes "
        "`x @ W.T + (alpha / r) * x @ A.T @ B.T`, PEFT's LoRA. Only the adapters are trained (the gradient is taken "
        "for them alone). The data are chats: a speech of the play as the user's turn and the speech that "
        "answers it as the assistant's, rendered by the tokenizer's own chat template (as vLLM renders every "
        "chat it serves), the loss counted on the answer's tokens only; each host feeds its own share, split over "
        "`data`."),
    new_code_cell(FINETUNE_SETUP),
    new_code_cell(FINETUNE),
    new_markdown_cell(
        "## Save the adapter as PEFT does\n\n"
        "`adapter_model.safetensors` with PEFT's tensor names (`base_model.model.` + the module's name + "
        "`.lora_A.weight`, `A` as [r, in] and `B` as [out, r]) and `adapter_config.json`: what "
        "`PeftModel.from_pretrained` and `vllm serve --lora-modules` read. `process_allgather` brings the "
        "split adapters whole to every host; host 0 writes them."),
    new_code_cell(SAVE),
    new_markdown_cell("Check the layout with the `safetensors` package, on the host that wrote it:"),
    new_code_cell(CHECK),
    new_markdown_cell(
        "## Serve base model and adapter\n\n"
        "A small standard-library server, like `08_serve.ipynb`'s, now with `/v1/chat/completions` (through the "
        "chat template), the models list and the usage chunk, started with `vllm serve`'s own arguments: it finds "
        "`tutorial/tiny-llama` in the host's Hugging Face cache by its name and serves the adapter as "
        "`coriolanus`, as `vllm serve tutorial/tiny-llama --enable-lora --lora-modules coriolanus=PATH` would."),
    new_code_cell("%%writefile {work}/server.py\n" + SERVER),
    new_markdown_cell(
        f"Start it as a service on host 0 (port {PORT}: a local slice's hosts share this machine's ports). "
        "`--wait-http` returns once it answers, and records the port for `%tpu_bench`."),
    new_code_cell(f"%tpu_sync $work $work\n%tpu_serve lm --hosts 0 --wait-http {PORT}/health -- cd $work && exec "
                  f"python3 server.py serve tutorial/tiny-llama --port {PORT} --enable-lora --max-lora-rank 8 "
                  "--lora-modules coriolanus=$work/adapter"),
    new_markdown_cell(
        "`%tpu_forward` gives a URL on this machine that reaches the port on host 0 (over the slice's SSH "
        "connection on a real slice; a local host's own address here)."),
    new_code_cell(FORWARD),
    new_markdown_cell(
        "Both models continue the same prompt, sampled with the same seed. Thirty steps of LoRA on a random model "
        "do not write Shakespeare, and the answers show it: what this tutorial exercises is the path (the files, "
        "the adapter's layout, the API), which is the same for a real model that answers sensibly."),
    new_code_cell(ASK),
    new_markdown_cell("A streamed chat answer: one event per token, then the usage chunk "
                      "(`stream_options.include_usage`), then `[DONE]`:"),
    new_code_cell(CHAT),
    new_markdown_cell(VLLM),
    new_markdown_cell(
        "## Benchmark it\n\n"
        "`%tpu_bench` streams chat requests to the service, as vLLM's `bench serve` does, at 1, 4 and 16 at "
        "once, with prompts of 24 tokens counted by the server's `/tokenize`, and reports TTFT, TPOT, ITL and "
        "throughput per level, with a plot of latency against throughput. Every prompt is distinct, in every "
        "level, so a server's prefix cache answers none from another; the client runs on the service's host, "
        "as published figures are taken (`--from-kernel`: from here, with the round trip beside the figures). "
        "`--save` writes `vllm bench sweep`'s folder: a `run=0.json` per level with vLLM's keys, and "
        "`summary.csv`."),
    new_code_cell(f"%tpu_bench lm --model coriolanus --chat --concurrency 1,4,16 --requests 16 --input-len 24 "
                  "--output-len 16 --save $work/bench", metadata=IGNORE),  # this run's timings
    new_markdown_cell(
        "This server makes one token at a time, however many requests are in flight: more at once do not raise "
        "its throughput (16 threads contending for one lock can even lower it), and each request waits longer "
        "for its first token. vLLM batches the requests in flight, which is what lifts throughput with "
        "concurrency. What the saved file says about every level:"),
    new_code_cell(
        "for c in (1, 4, 16):\n"
        '    level = json.load(open(f"{work}/bench/BENCH--max_concurrency={c}/run=0.json"))\n'
        "    print(f\"concurrency {level['max_concurrency']:2}: {level['completed']} completed, {level['failed']} failed, \"\n"
        "          f\"{level['total_input_tokens']} prompt and {level['total_output_tokens']} output tokens\")"),
    new_markdown_cell("## Stop\n\n`%tpu_down` ends the service and the slice; then the stand-in and this "
                      "machine's files go."),
    new_code_cell("%tpu_down\nhub.stop()\nimport shutil\n\nshutil.rmtree(work)"),
]

write("10_hf_finetune_serve.ipynb", cells)
