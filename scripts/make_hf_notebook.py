"""Writes notebooks/10_hf_finetune_serve.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_hf_notebook.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import IGNORE, JSON_REPLY, write

PORT = 18100  # the server's port on host 0 (08_serve uses 18000 and 18080; local hosts share this machine's ports)

MAKE_MODEL = (
    "import json, os, secrets, tempfile\n"
    "from importlib.resources import files\n\n"
    "import numpy as np\n"
    "from safetensors.numpy import save_file\n"
    "from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers\n\n"
    'work = tempfile.mkdtemp(prefix="tpunb-hf-")   # the same path on the hosts\n'
    'made = os.path.join(work, "made")             # the model as it is published\n'
    "os.makedirs(made)\n"
    'text = (files("tpunb") / "data" / "coriolanus.txt").read_text()   # Shakespeare, public domain\n\n'
    "# a byte-level BPE tokenizer of 512 tokens (the text's characters and their commonest merges): tokenizer.json\n"
    "tokenizer = Tokenizer(models.BPE())\n"
    "tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)\n"
    "tokenizer.decoder = decoders.ByteLevel()\n"
    'tokenizer.train_from_iterator([text], trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"],\n'
    "                              show_progress=False))\n"
    'tokenizer.save(f"{made}/tokenizer.json")\n'
    'chat_template = ("{% for m in messages %}{{ m[\'role\'] }}: {{ m[\'content\'] }}\\n{% endfor %}"\n'
    "                 \"{% if add_generation_prompt %}assistant:{% endif %}\")\n"
    'json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "chat_template": chat_template},\n'
    '          open(f"{made}/tokenizer_config.json", "w"), indent=1)\n\n'
    "# config.json as transformers writes it for a Llama: 2 layers, 4 query heads sharing 2 key/value heads\n"
    'config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,\n'
    '          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,\n'
    '          "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,\n'
    '          "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0,\n'
    '          "torch_dtype": "float32"}\n'
    'json.dump(config, open(f"{made}/config.json", "w"), indent=1)\n\n'
    "# the weights under Hugging Face's names, each linear layer [out, in] (random: they stand in for a pretrained model)\n"
    'd, ff, vocab, hd = 64, 128, 512, 16\n'
    'shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,), "lm_head.weight": (vocab, d)}\n'
    "for i in range(2):\n"
    '    attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"\n'
    '    shapes |= {f"{attn}.q_proj.weight": (4 * hd, d), f"{attn}.k_proj.weight": (2 * hd, d),\n'
    '               f"{attn}.v_proj.weight": (2 * hd, d), f"{attn}.o_proj.weight": (d, 4 * hd),\n'
    '               f"{mlp}.gate_proj.weight": (ff, d), f"{mlp}.up_proj.weight": (ff, d), f"{mlp}.down_proj.weight": (d, ff),\n'
    '               f"model.layers.{i}.input_layernorm.weight": (d,), f"model.layers.{i}.post_attention_layernorm.weight": (d,)}\n'
    "rng = np.random.default_rng(0)\n"
    "weights = {name: (np.ones(shape) if len(shape) == 1 else\n"
    '                  rng.normal(0, 1.0 if name.startswith("model.embed") else shape[1] ** -0.5, shape)).astype(np.float32)\n'
    "           for name, shape in shapes.items()}\n"
    'save_file(weights, f"{made}/model.safetensors", metadata={"format": "pt"})\n'
    "for name in sorted(os.listdir(made)):\n"
    '    print(f"{name:22} {os.path.getsize(os.path.join(made, name)):>8,} bytes")\n'
    'print(f"{sum(w.size for w in weights.values()):,} parameters")'
)

LLAMA = (
    '"""A Llama-shaped causal LM in plain JAX that reads Hugging Face\'s names and layout: the\n'
    'fine-tuning cells and the server both import it."""\n'
    "import json, os\n\n"
    "import jax, jax.numpy as jnp\n"
    "from jax.sharding import NamedSharding, PartitionSpec as P\n"
    "from safetensors import safe_open\n\n"
    'COLUMNS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")   # split by output rows on the "model" axis\n'
    'ROWS = ("o_proj", "down_proj")                                      # split by input columns\n\n\n'
    "def module(layer, name):\n"
    '    """Hugging Face\'s name of a layer\'s linear module, e.g. model.layers.0.self_attn.q_proj."""\n'
    "    block = \"mlp\" if name in (\"gate_proj\", \"up_proj\", \"down_proj\") else \"self_attn\"\n"
    '    return f"model.layers.{layer}.{block}.{name}"\n\n\n'
    "def spec(name):\n"
    '    """How a weight ([out, in], as Hugging Face stores it) is split over the mesh\'s "model" axis."""\n'
    '    if name.endswith(tuple(f"{n}.weight" for n in COLUMNS)) or name in ("model.embed_tokens.weight", "lm_head.weight"):\n'
    '        return P("model", None)\n'
    '    if name.endswith(tuple(f"{n}.weight" for n in ROWS)):\n'
    '        return P(None, "model")\n'
    "    return P()   # norms: whole on every device\n\n\n"
    "def load(folder, mesh=None):\n"
    '    """(config, weights) of a Hugging Face folder. With a mesh, every weight is a jax.Array split\n'
    "    over it, and each process reads from model.safetensors only the slices its own devices hold.\"\"\"\n"
    '    config = json.load(open(os.path.join(folder, "config.json")))\n'
    "    weights = {}\n"
    '    with safe_open(os.path.join(folder, "model.safetensors"), "numpy") as f:\n'
    "        for name in f.keys():\n"
    "            if mesh is None:\n"
    "                weights[name] = jnp.asarray(f.get_tensor(name))\n"
    "                continue\n"
    "            part = f.get_slice(name)\n"
    "            weights[name] = jax.make_array_from_callback(\n"
    "                tuple(part.get_shape()), NamedSharding(mesh, spec(name)), lambda index, part=part: part[index])\n"
    "    return config, weights\n\n\n"
    "def rms_norm(x, weight, eps):\n"
    "    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight\n\n\n"
    "def rotate(x, positions, theta):\n"
    '    """Rotary position embedding as Hugging Face\'s Llama applies it (two halves, not interleaved)."""\n'
    "    half = x.shape[-1] // 2\n"
    "    angles = positions[:, None] * theta ** (-jnp.arange(half) / half)\n"
    "    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]\n"
    "    x1, x2 = x[..., :half], x[..., half:]\n"
    "    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)\n\n\n"
    "def forward(config, weights, lora, ids, pad=0):\n"
    '    """Logits for ids [batch, seq]. ``lora`` maps a module\'s name to (A [r, in], B [out, r], scale):\n'
    "    that layer computes x @ W.T + scale * x @ A.T @ B.T, as PEFT's LoRA does. The first ``pad``\n"
    '    positions of every row are padding that no token attends to."""\n'
    '    heads, kv_heads, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]\n'
    '    eps, theta = config["rms_norm_eps"], config["rope_theta"]\n'
    "    b, t = ids.shape\n"
    "    positions = jnp.arange(t) - pad\n"
    "    keep = jnp.tril(jnp.ones((t, t), bool)) & (jnp.arange(t) >= pad)[None, :]   # causal, padding masked\n\n"
    "    def linear(x, name):\n"
    '        y = x @ weights[f"{name}.weight"].T\n'
    "        if name in lora:\n"
    "            a, b_, scale = lora[name]\n"
    "            y = y + (x @ a.T) @ b_.T * scale\n"
    "        return y\n\n"
    '    x = weights["model.embed_tokens.weight"][ids]\n'
    '    for i in range(config["num_hidden_layers"]):\n'
    '        h = rms_norm(x, weights[f"model.layers.{i}.input_layernorm.weight"], eps)\n'
    '        q = rotate(linear(h, module(i, "q_proj")).reshape(b, t, heads, hd), positions, theta)\n'
    '        k = rotate(linear(h, module(i, "k_proj")).reshape(b, t, kv_heads, hd), positions, theta)\n'
    '        v = linear(h, module(i, "v_proj")).reshape(b, t, kv_heads, hd)\n'
    "        k, v = (jnp.repeat(z, heads // kv_heads, axis=2) for z in (k, v))   # grouped-query attention\n"
    '        scores = jnp.where(keep, jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(hd), -1e9)\n'
    '        attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), v).reshape(b, t, heads * hd)\n'
    '        x = x + linear(attended, module(i, "o_proj"))\n'
    '        h = rms_norm(x, weights[f"model.layers.{i}.post_attention_layernorm.weight"], eps)\n'
    '        x = x + linear(jax.nn.silu(linear(h, module(i, "gate_proj"))) * linear(h, module(i, "up_proj")),\n'
    '                       module(i, "down_proj"))\n'
    '    return rms_norm(x, weights["model.norm.weight"], eps) @ weights["lm_head.weight"].T\n'
)

LOAD = (
    "%%on_tpu\nimport json, os, sys\n\n"
    "import jax, jax.numpy as jnp, numpy as np, optax\n"
    "from jax.sharding import AxisType, NamedSharding, PartitionSpec as P\n"
    "from tokenizers import Tokenizer\n\n"
    "sys.path.insert(0, work)\nimport llama\n\n"
    "folder = os.path.join(work, \"tiny-llama\")\n"
    'mesh = jax.make_mesh((jax.process_count(), jax.local_device_count()), ("data", "model"),\n'
    "                     axis_types=(AxisType.Auto,) * 2)   # hosts x chips\n"
    "config, weights = llama.load(folder, mesh)\n"
    'q = weights["model.layers.0.self_attn.q_proj.weight"]\n'
    'print(f"{len(weights)} tensors on {mesh.devices.size} devices; q_proj {q.shape} is split {q.sharding.spec}: "\n'
    '      f"this host holds {len(q.addressable_shards)} pieces of {q.addressable_shards[0].data.shape}")'
)

FINETUNE_SETUP = (
    '%%on_tpu\nRANK, ALPHA, TARGETS = 8, 16, ("q_proj", "v_proj")   # PEFT\'s default targets for a Llama\n'
    "SEQ, BATCH = 32, 16\n"
    "host, hosts = jax.process_index(), jax.process_count()\n"
    'tokens = np.array(Tokenizer.from_file(f"{folder}/tokenizer.json").encode(text).ids, np.int32)\n'
    "mine = np.array_split(tokens, hosts)[host]   # this host's half of the text\n\n"
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
    "def loss_fn(lora, x, y):\n"
    "    scaled = {name: (a, b, ALPHA / RANK) for name, (a, b) in lora.items()}\n"
    "    return optax.softmax_cross_entropy_with_integer_labels(llama.forward(config, weights, scaled, x), y).mean()\n\n"
    "optimizer = optax.adam(3e-2)\n"
    "opt_state = optimizer.init(lora)\n"
    "opt_state = jax.tree.map(lambda a: a if a.ndim else jax.device_put(a, NamedSharding(mesh, P())), opt_state)\n\n"
    "@jax.jit\n"
    "def step(lora, opt_state, x, y):   # gradients for the adapters only: the base weights are constants\n"
    "    loss, grads = jax.value_and_grad(loss_fn)(lora, x, y)\n"
    "    updates, opt_state = optimizer.update(grads, opt_state)\n"
    "    return optax.apply_updates(lora, updates), opt_state, loss\n\n"
    'batch_sharding = NamedSharding(mesh, P("data"))   # each host feeds its own rows\n'
    "def batch(i):\n"
    "    starts = np.random.default_rng([i, host]).integers(0, len(mine) - SEQ - 1, BATCH // hosts)\n"
    "    windows = np.stack([mine[s : s + SEQ + 1] for s in starts])\n"
    "    return [jax.make_array_from_process_local_data(batch_sharding, w) for w in (windows[:, :-1], windows[:, 1:])]\n\n"
    "trained = sum(a.size + b.size for a, b in lora.values())\n"
    'print(f"LoRA trains {trained:,} parameters on {len(names)} layers; the {sum(w.size for w in weights.values()):,} "\n'
    '      "of the base model stay frozen")'
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

SERVER = (
    '"""An OpenAI-style server for the tiny Llama and its LoRA adapter, as `vllm serve --enable-lora` answers:\n'
    "GET /v1/models, POST /tokenize, /v1/completions and /v1/chat/completions; with \"stream\": true one\n"
    'server-sent event per token, and a last chunk with the usage when stream_options.include_usage asks."""\n'
    "import json, os, sys, threading, time\n"
    "from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer\n\n"
    "import jax, jax.numpy as jnp\n"
    "from safetensors.numpy import load_file\n"
    "from tokenizers import Tokenizer\n\n"
    "import llama\n\n"
    "port, base, lora_name, lora_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]\n"
    'BASE, CONTEXT = "tutorial/tiny-llama", 64   # tokens the model sees at a time\n'
    "config, weights = llama.load(base)\n"
    'tokenizer = Tokenizer.from_file(os.path.join(base, "tokenizer.json"))\n'
    'settings = json.load(open(os.path.join(lora_dir, "adapter_config.json")))\n'
    'tensors = load_file(os.path.join(lora_dir, "adapter_model.safetensors"))\n'
    'scale = settings["lora_alpha"] / settings["r"]\n'
    'lora = {name.removeprefix("base_model.model.").removesuffix(".lora_A.weight"):\n'
    '        (jnp.asarray(a), jnp.asarray(tensors[name.replace("lora_A", "lora_B")]), scale)\n'
    '        for name, a in tensors.items() if name.endswith(".lora_A.weight")}\n'
    "# the base model is the adapter at scale 0, so one compiled program serves both (--lora-modules NAME=PATH)\n"
    "MODELS = {BASE: {name: (a, b, 0.0) for name, (a, b, _) in lora.items()}, lora_name: lora}\n"
    "lock = threading.Lock()   # one step at a time: this server does not batch requests (vLLM does)\n\n\n"
    "@jax.jit\n"
    "def next_token(lora, window, pad, temperature, key):\n"
    "    logits = llama.forward(config, weights, lora, window[None], pad)[0, -1]\n"
    "    sampled = jax.random.categorical(key, logits / jnp.maximum(temperature, 1e-6))\n"
    "    return jnp.where(temperature > 0, sampled, jnp.argmax(logits))   # greedy at temperature 0\n\n\n"
    "def generate(model, ids, max_tokens, temperature=0.0, seed=0):\n"
    "    ids, key = list(ids), jax.random.key(seed)\n"
    "    for step in range(max_tokens):\n"
    "        window = ids[-CONTEXT:]\n"
    "        with lock:\n"
    "            token = int(next_token(MODELS[model], jnp.array([0] * (CONTEXT - len(window)) + window),\n"
    "                                   CONTEXT - len(window), temperature, jax.random.fold_in(key, step)))\n"
    "        ids.append(token)\n"
    "        yield token\n\n\n"
    "def prompt_of(body, chat):\n"
    '    """The text the model continues: a chat\'s messages through the chat template of tokenizer_config.json."""\n'
    "    if not chat:\n"
    '        return body.get("prompt", "")\n'
    '    return "".join(f"{m[\'role\']}: {m[\'content\']}\\n" for m in body.get("messages", [])) + "assistant:"\n\n\n'
    "class Handler(BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    '        if self.path == "/v1/models":\n'
    '            return self.reply({"object": "list", "data": [{"id": m, "object": "model", "root": BASE if m == BASE else lora_dir,\n'
    '                                                           "parent": None if m == BASE else BASE} for m in MODELS]})\n'
    '        self.reply({"status": "ok"})   # /health, which --wait-http asks\n\n'
    "    def do_POST(self):\n"
    '        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")\n'
    '        chat = self.path == "/v1/chat/completions"\n'
    '        if self.path == "/tokenize":   # vLLM\'s: how many tokens a prompt is (%tpu_bench --input-len asks)\n'
    '            ids = tokenizer.encode(prompt_of(body, "messages" in body)).ids\n'
    '            return self.reply({"count": len(ids), "tokens": ids, "max_model_len": CONTEXT})\n'
    '        if self.path not in ("/v1/completions", "/v1/chat/completions"):\n'
    '            return self.reply({"error": {"message": f"no route {self.path}"}}, 404)\n'
    '        model = body.get("model", BASE)\n'
    "        if model not in MODELS:\n"
    '            return self.reply({"error": {"message": f"the model {model} does not exist", "code": 404}}, 404)\n'
    "        ids = tokenizer.encode(prompt_of(body, chat)).ids\n"
    '        n = int(body.get("max_tokens", 16))   # it has no end-of-sequence: every answer is max_tokens long\n'
    '        sampling = float(body.get("temperature", 0.0)), int(body.get("seed", 0))\n'
    '        usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}\n'
    '        kind, rid = ("chat.completion", "chatcmpl-1") if chat else ("text_completion", "cmpl-1")\n'
    '        if not body.get("stream"):\n'
    "            text = tokenizer.decode(list(generate(model, ids, n, *sampling)))\n"
    '            choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}\n'
    '            return self.reply({"id": rid, "object": kind, "model": model, "usage": usage,\n'
    '                               "choices": [{"index": 0, **choice, "finish_reason": "length"}]})\n'
    "        self.send_response(200)\n"
    '        self.send_header("Content-Type", "text/event-stream")\n'
    "        self.end_headers()\n"
    '        made, shown = [], ""\n'
    "        for token in generate(model, ids, n, *sampling):   # one event per token, sent as soon as it is made\n"
    "            made.append(token)\n"
    "            text = tokenizer.decode(made)\n"
    "            piece, shown = text[len(shown):], text\n"
    '            choice = {"delta": {"content": piece}} if chat else {"text": piece}\n'
    '            self.event({"id": rid, "object": kind + (".chunk" if chat else ""), "model": model,\n'
    '                        "choices": [{"index": 0, **choice, "finish_reason": None}]})\n'
    '        if (body.get("stream_options") or {}).get("include_usage"):   # the usage chunk: no choices\n'
    '            self.event({"id": rid, "object": kind + (".chunk" if chat else ""), "model": model, "choices": [],\n'
    '                        "usage": usage})\n'
    '        self.wfile.write(b"data: [DONE]\\n\\n")\n\n'
    "    def event(self, value):\n"
    '        self.wfile.write(b"data: " + json.dumps(value).encode() + b"\\n\\n")\n'
    "        self.wfile.flush()\n\n"
    + JSON_REPLY +
    "    def log_message(self, fmt, *args):   # the service's log: completions only, without the clock\n"
    '        if self.path.endswith("completions"):\n'
    "            print(self.command, self.path, args[1], flush=True)\n\n\n"
    "for model in MODELS:   # compile before answering: readiness means fast answers\n"
    "    list(generate(model, [0], 1))\n"
    'print(f"serving {BASE} and {lora_name} (LoRA r={settings[\'r\']}) on port {port}", flush=True)\n'
    'ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()\n'
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

VLLM = (
    "## The same on a real v6e-8, with vLLM\n\n"
    "`vllm serve` answers the same routes, and `--enable-lora --lora-modules NAME=PATH` serves the adapter "
    "beside its base model, under its own name, from exactly the folder saved above. On a Cloud TPU v6e-8 "
    "(one host, 8 chips), with vLLM's TPU backend (`pip install vllm-tpu` on the host) and a real model "
    "fetched as above:\n\n"
    "```\n"
    "%tpu_launch v6e-8 --zone us-east5-b --name gemma\n"
    "%tpu_secret HF_TOKEN\n"
    "%tpu_fetch hf://google/gemma-3-4b-it --to ~/models/gemma\n"
    "# ... fine-tune and save ~/adapters/mine as above ...\n"
    "%tpu_run pip install vllm-tpu\n"
    "%tpu_serve vllm --wait-http 8000/health --timeout 1800 -- vllm serve ~/models/gemma "
    "--served-model-name google/gemma-3-4b-it --tensor-parallel-size 8 --max-model-len 4096 "
    "--enable-lora --max-lora-rank 8 --lora-modules mine=~/adapters/mine --port 8000\n"
    "%tpu_bench vllm --model mine --chat --concurrency 1,16,64 --input-len 1024 --output-len 128\n"
    "```\n\n"
    "The first start compiles for minutes; the compile cache (`VLLM_XLA_CACHE_PATH`, set on every host) makes the "
    "next start after `%tpu_restart` fast, and `%tpu_launch --compile-cache gs://BUCKET/PATH` keeps it across "
    "slices. `--max-lora-rank` must be at least the adapter's `r`."
)

cells = [
    new_markdown_cell(
        "# A Hugging Face model: fetch, LoRA fine-tune, serve, benchmark\n\n"
        "The path most TPU work walks: bring a model from the Hugging Face Hub with a token, fine-tune it with "
        "LoRA, serve it with the adapter behind an OpenAI-style API, and measure time to first token and "
        "throughput. At toy scale, on a simulated **v4-16 (2 hosts x 4 chips)**:\n\n"
        "1. make a tiny Llama-shaped model in Hugging Face's format (`config.json`, `tokenizer.json`, "
        "`model.safetensors`) and publish it;\n"
        "2. `%tpu_fetch` it to every host: one download per slice, not one per host;\n"
        "3. load it **sharded** over the slice's 8 devices and LoRA-fine-tune it in JAX;\n"
        "4. save the adapter in PEFT's layout, the one `vllm serve --lora-modules` reads;\n"
        "5. serve base model and adapter with `%tpu_serve`, and sweep them with `%tpu_bench`.\n\n"
        "**What stands in for the Hub here:** `tpunb.emulator.hub`, a local server that speaks the Hub's HTTP API "
        "(the tree listing, `resolve` with LFS redirects, gated repositories that answer 401 without a token) to "
        "the real `huggingface_hub` client; it is not a mock that accepts anything. **On a real slice** skip the "
        "stand-in cell: launch with `%tpu_launch v4-16 --zone us-central2-b` (or a v6e-8), give your token with "
        "`%tpu_secret HF_TOKEN` (from the environment, Colab's secrets or a prompt; it never appears in outputs) "
        "and fetch `hf://ORG/NAME` of a real model. The hosts need `safetensors` and `tokenizers` too: "
        "`%tpu_launch ... --pip \"safetensors tokenizers\"`."),
    new_code_cell("%load_ext tpunb\n%tpu_launch v4-16 --name hf"),
    new_markdown_cell(
        "## A tiny Llama in Hugging Face's format\n\n"
        "A byte-level BPE tokenizer trained on Coriolanus with the `tokenizers` package, a `config.json` as "
        "`transformers` writes one for Llama, and `model.safetensors` with the weights under Llama's names "
        "(`model.layers.0.self_attn.q_proj.weight`, ...): a real checkpoint has the same files, only larger."),
    new_code_cell(MAKE_MODEL),
    new_markdown_cell(
        "## Publish it, and fetch it to every host\n\n"
        "Start the Hub stand-in and put the files in a **gated** repository, which answers only with a token. "
        "On the real Hub you would upload them (`huggingface_hub.upload_folder`) or use a published model; the "
        "stand-in serves downloads only, so the notebook hands it the files. `HF_ENDPOINT` points "
        "`huggingface_hub` (and `%tpu_fetch`) at it, as it would at a Hub mirror. The token is made up here; "
        "`%tpu_secret` puts it in the hosts' environment and masks it in everything they print."),
    new_code_cell(
        "from tpunb.emulator.hub import Hub, HubServer\n\n"
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
        "hashes. A local slice's hosts share this machine's disk, so the files are written once:"),
    new_code_cell("%tpu_fetch hf://tutorial/tiny-llama --to $work/tiny-llama"),
    new_markdown_cell("A second fetch finds them there and moves nothing:"),
    new_code_cell("%tpu_fetch hf://tutorial/tiny-llama --to $work/tiny-llama"),
    new_markdown_cell(
        "## Load it sharded over the slice\n\n"
        "The model's code lives in a file, so that both the cells on the hosts and the server import it: a "
        "Llama forward pass in plain JAX over a dict of Hugging Face's tensors (RMSNorm, rotary embeddings, "
        "grouped-query attention, a SwiGLU MLP), with LoRA on any linear layer."),
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
        "for them alone); each host feeds its own half of the text, split over `data`."),
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
        "A small standard-library server, like `08_serve.ipynb`'s, now with `/v1/chat/completions`, the models "
        "list and the usage chunk: it serves the base model as `tutorial/tiny-llama` and the adapter as "
        "`coriolanus`, as `vllm serve --enable-lora --lora-modules coriolanus=PATH` would."),
    new_code_cell("%%writefile {work}/server.py\n" + SERVER),
    new_markdown_cell(
        f"Start it as a service on host 0 (port {PORT}: a local slice's hosts share this machine's ports). "
        "`--wait-http` returns once it answers, and records the port for `%tpu_bench`."),
    new_code_cell(f"%tpu_sync $work $work\n%tpu_serve lm --hosts 0 --wait-http {PORT}/health -- "
                  f"cd $work && exec python3 server.py {PORT} tiny-llama coriolanus adapter"),
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
