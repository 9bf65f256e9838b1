"""Writes notebooks/08_serve.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_serve_notebook.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import BLOCK, IGNORE, JSON_REPLY, write

MODEL = (
    '"""A tiny character-level transformer LM and its jitted generate step: what the server serves."""\n'
    "import jax, jax.numpy as jnp\nfrom flax import nnx\n\n"
    "CONTEXT = 32   # characters the model sees\n\n\n"
    + BLOCK + "\n"
    "class CharLM(nnx.Module):\n"
    "    def __init__(self, vocab, d=64, heads=4, rngs=None):\n"
    "        self.embed = nnx.Embed(vocab, d, rngs=rngs)\n"
    "        self.pos = nnx.Param(jax.random.normal(rngs.params(), (CONTEXT, d)) * 0.02)\n"
    "        self.block = Block(d, heads, rngs)\n"
    "        self.out = nnx.Linear(d, vocab, rngs=rngs)\n\n"
    "    def __call__(self, ids):\n"
    "        return self.out(self.block(self.embed(ids) + self.pos[: ids.shape[1]]))\n\n\n"
    "@nnx.jit\n"
    "def next_token(model, window, temperature, key):\n"
    '    """The token after a window of CONTEXT ids: greedy at temperature 0, else sampled."""\n'
    "    logits = model(window[None])[0, -1]\n"
    "    sampled = jax.random.categorical(key, logits / jnp.maximum(temperature, 1e-6))\n"
    "    return jnp.where(temperature > 0, sampled, jnp.argmax(logits))\n"
)

SERVER = (
    '"""POST /v1/completions (OpenAI style) for charlm, streamed as server-sent events with "stream": true."""\n'
    "import json, pickle, sys, threading, time\n"
    "from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer\n\n"
    "import jax, jax.numpy as jnp\nfrom flax import nnx\n\n"
    "from charlm import CONTEXT, CharLM, next_token\n\n"
    "port, weights = int(sys.argv[1]), sys.argv[2]\n"
    'with open(weights, "rb") as f:\n'
    "    saved = pickle.load(f)\n"
    'vocab = saved["vocab"]\n'
    "index = {c: i for i, c in enumerate(vocab)}\n"
    'graphdef, state = nnx.split(CharLM(len(vocab), rngs=nnx.Rngs(0)))\n'
    'nnx.replace_by_pure_dict(state, saved["params"])\n'
    "model = nnx.merge(graphdef, state)\n"
    "lock = threading.Lock()   # one step at a time: this server does not batch requests (vLLM does)\n\n\n"
    "def generate(prompt, max_tokens, temperature=0.0, seed=0):\n"
    "    ids = [index.get(c, index[' ']) for c in prompt][-CONTEXT:]\n"
    "    window = jnp.array([index[' ']] * (CONTEXT - len(ids)) + ids)\n"
    "    key = jax.random.key(seed)\n"
    "    for step in range(max_tokens):\n"
    "        with lock:\n"
    "            token = next_token(model, window, temperature, jax.random.fold_in(key, step))\n"
    "        window = jnp.append(window[1:], token)\n"
    "        yield vocab[int(token)]\n\n\n"
    "class Handler(BaseHTTPRequestHandler):\n"
    "    def do_GET(self):   # what --wait-http asks\n"
    '        self.reply({"status": "ok", "model": "charlm"})\n\n'
    "    def do_POST(self):\n"
    '        if self.path != "/v1/completions":\n'
    '            return self.reply({"error": {"message": f"no route {self.path}"}}, 404)\n'
    '        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")\n'
    '        prompt, n = body.get("prompt", ""), int(body.get("max_tokens", 16))\n'
    '        tokens = generate(prompt, n, float(body.get("temperature", 0.0)), int(body.get("seed", 0)))\n'
    '        if not body.get("stream"):\n'
    '            return self.reply({"object": "text_completion", "model": "charlm", "choices": [\n'
    '                {"index": 0, "text": "".join(tokens), "finish_reason": "length"}],\n'
    '                "usage": {"prompt_tokens": len(prompt), "completion_tokens": n}})\n'
    "        self.send_response(200)\n"
    '        self.send_header("Content-Type", "text/event-stream")\n'
    "        self.end_headers()\n"
    "        for text in tokens:   # one event per token, sent as soon as it is made\n"
    '            event = {"object": "text_completion", "model": "charlm", "choices": [{"index": 0, "text": text}]}\n'
    '            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\\n\\n")\n'
    '        self.wfile.write(b"data: [DONE]\\n\\n")\n\n'
    + JSON_REPLY +
    "    def log_message(self, fmt, *args):   # the service's log: POSTs, without the clock\n"
    '        if self.command == "POST":\n'
    '            print(self.command, self.path, args[1], flush=True)\n\n\n'
    "list(generate('warm up', 2))   # compile before answering: readiness means fast answers\n"
    'print(f"charlm: {len(vocab)} characters, serving POST /v1/completions on port {port}", flush=True)\n'
    'ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()\n'
)

cells = [
    new_markdown_cell(
        "# Serve a model from a slice\n\n"
        "A service is a command that runs on the hosts **beside** your cells: it keeps running while other cells "
        "run, and even when this kernel restarts (`%tpu_use` finds it again). This tutorial trains a tiny "
        "character-level model on a one-host slice, serves it behind an OpenAI-style `POST /v1/completions` "
        "endpoint, reaches the host's port from the notebook with `%tpu_forward`, measures time to first token "
        "(TTFT) and tokens per second over 20 streamed requests, reads the service's log, restarts it after a "
        "crash, serves the slice's profile, and stops everything.\n\n"
        "Here the slice is **simulated** (one process on this machine, its chips as JAX CPU devices). **On a real "
        "slice** launch with `%tpu_launch v6e-8 --zone us-east5-b` (or any one-host type): every cell runs "
        "unchanged, and the last section shows the same commands serving a real model with vLLM."),
    new_code_cell("%load_ext tpunb\n%tpu_launch v4-8 --name serving"),
    new_markdown_cell(
        "## The model, and a few training steps\n\n"
        "The model lives in a file, so that both a cell on the host (to train it) and the server (to serve it) "
        "import it. `%%writefile` writes it here; `%tpu_sync` copies the folder to the hosts (a local slice's "
        "hosts share this machine's files). The jitted `next_token` is the server's generate step."),
    new_code_cell('import tempfile\nfrom importlib.resources import files\n\n'
                  'work = tempfile.mkdtemp(prefix="tpunb-serve-")   # the same path on the hosts\n'
                  'text = (files("tpunb") / "data" / "coriolanus.txt").read_text()\n'
                  "%tpu_push work text"),
    new_code_cell("%%writefile {work}/charlm.py\n" + MODEL),
    new_markdown_cell("Train it for 300 steps on Coriolanus (a few seconds), on the host, and save its weights "
                      "next to the code:"),
    new_code_cell(
        "%%on_tpu\nimport os, pickle, sys\n\nimport jax, jax.numpy as jnp, numpy as np, optax\nfrom flax import nnx\n\n"
        "sys.path.insert(0, work)\nfrom charlm import CONTEXT, CharLM, next_token\n\n"
        "vocab = sorted(set(text))\n"
        "tokens = np.array([vocab.index(c) for c in text], dtype=np.int32)\n"
        "model = CharLM(len(vocab), rngs=nnx.Rngs(0))\n"
        "opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)\n\n"
        "@nnx.jit\ndef train_step(model, opt, batch):\n"
        "    def loss_fn(model):\n"
        "        logits = model(batch[:, :-1])\n"
        "        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()\n"
        "    loss, grads = nnx.value_and_grad(loss_fn)(model)\n"
        "    opt.update(model, grads)\n"
        "    return loss\n\n"
        "rng = np.random.default_rng(0)\n"
        "for step in range(300):\n"
        "    starts = rng.integers(0, len(tokens) - CONTEXT - 1, 32)\n"
        "    loss = train_step(model, opt, jnp.array(np.stack([tokens[s:s + CONTEXT + 1] for s in starts])))\n"
        "    if step in (0, 299):\n"
        "        print(f'step {step}: loss {float(loss):.1f}')\n\n"
        "params = jax.tree.map(np.asarray, nnx.state(model, nnx.Param).to_pure_dict())\n"
        "with open(os.path.join(work, 'charlm.pkl'), 'wb') as f:\n"
        "    pickle.dump({'vocab': vocab, 'params': params}, f)\n"
        "print(f'saved {sum(p.size for p in jax.tree.leaves(params)):,} parameters')"),
    new_markdown_cell(
        "## The server\n\n"
        "A standard-library `ThreadingHTTPServer` that answers `POST /v1/completions` as OpenAI's API does: "
        "`prompt`, `max_tokens`, `temperature`, and `\"stream\": true` for one server-sent event per token. "
        "It compiles the generate step before it listens, so that once it answers it answers fast."),
    new_code_cell("%%writefile {work}/server.py\n" + SERVER),
    new_code_cell("%tpu_sync $work $work"),
    new_markdown_cell(
        "Start it as a service on host 0. `--wait-http` returns once `GET /health` answers on the host; "
        "`--restart on-failure` starts it again if it crashes. On a local slice every host shares this "
        "machine's ports, so this tutorial uses 18000 (on a real host, 8000 is the usual)."),
    new_code_cell("%tpu_serve lm --hosts 0 --restart on-failure --wait-http 18000/health -- "
                  "cd $work && exec python3 server.py 18000 charlm.pkl"),
    new_markdown_cell(
        "`%tpu_forward` gives a URL on this machine that reaches the port on the host, carried over the slice's "
        "SSH connection as `ssh -L` would. `--local-port` picks this machine's port (without it: a free one; "
        "and for a local slice's host, its own address, as there is nothing to carry). Ask for a completion:"),
    new_code_cell(
        "import json, time, urllib.request\n\n"
        "url = %tpu_forward 18000 --local-port 18080\nprint(url)\n\n\n"
        "def post(body):\n"
        "    return urllib.request.urlopen(urllib.request.Request(\n"
        '        url + "v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}), timeout=60)\n\n\n'
        'with post({"prompt": "MENENIUS:\\n", "max_tokens": 48, "temperature": 0.8}) as answer:\n'
        "    completion = json.load(answer)\n"
        'print(completion["choices"][0]["text"])\nprint(completion["usage"])'),
    new_markdown_cell(
        "## TTFT and tokens per second\n\n"
        "Stream 20 requests, one after another, and time each event as it arrives: the first one is the time "
        "to first token, the rest give the decode rate."),
    new_code_cell(
        "def stream(prompt, max_tokens=32):\n"
        '    """(text, seconds at which each token arrived) of one streamed completion."""\n'
        '    start, times, out = time.perf_counter(), [], ""\n'
        '    with post({"prompt": prompt, "max_tokens": max_tokens, "stream": True}) as answer:\n'
        "        for line in answer:\n"
        '            if line.startswith(b"data: {"):\n'
        "                times.append(time.perf_counter() - start)\n"
        '                out += json.loads(line[6:])["choices"][0]["text"]\n'
        "    return out, times\n\n\n"
        "prompts = [line for line in text.splitlines() if line.endswith(':')][:20]   # speakers' names\n"
        "runs = [stream(p) for p in prompts]\n"
        "ttft = [times[0] * 1000 for _, times in runs]\n"
        "rate = [(len(times) - 1) / (times[-1] - times[0]) for _, times in runs]\n"
        "print(f'{len(runs)} requests answered, {sum(len(t) for _, t in runs)} tokens streamed')\n"
        "with post({'prompt': prompts[0], 'max_tokens': 32}) as answer:\n"
        "    print('streamed text = non-streamed text:', runs[0][0] == json.load(answer)['choices'][0]['text'])"),
    new_code_cell(
        "import matplotlib.pyplot as plt\nimport numpy as np\n\n"
        "print(f'TTFT median {np.median(ttft):.1f} ms, p90 {np.percentile(ttft, 90):.1f} ms; '\n"
        "      f'output {np.median(rate):.0f} tokens/s per request (median)')\n"
        "fig, (a, b) = plt.subplots(1, 2, figsize=(9, 2.6))\n"
        "a.bar(range(1, 21), ttft); a.set(title='time to first token', xlabel='request', ylabel='ms')\n"
        "b.bar(range(1, 21), rate, color='tab:green'); b.set(title='output tokens/s', xlabel='request')\n"
        "fig.tight_layout()", metadata=IGNORE),  # this run's timings
    new_markdown_cell("## Its log, a crash and a restart\n\nThe service's output goes to a log file on the host:"),
    new_code_cell("%tpu_logs lm --tail 3"),
    new_markdown_cell(
        "Kill the server as a crash would (`kill -9` on the host). `--restart on-failure` starts it again after "
        "a back-off of a second (and gives up after 5 crashes in a row); wait until it runs again, then until it "
        "answers:"),
    new_code_cell(
        "import tpunb\n\nsl = tpunb.current()\n"
        "pid = next(s.pid for s in sl.services() if s.name == 'lm')\n"
        "%tpu_run kill -9 $pid\n\n"
        "deadline = time.monotonic() + 60\n"
        "while not any(s.name == 'lm' and s.restarts == 1 and s.state == 'running' for s in sl.services()):\n"
        "    assert time.monotonic() < deadline, 'the service was not restarted'\n"
        "    time.sleep(0.2)\n"
        "while True:   # running again, compiling: the forward says once that nothing answers yet\n"
        "    try:\n"
        '        urllib.request.urlopen(url + "health", timeout=5).close()\n'
        "        break\n"
        "    except OSError:\n"
        "        assert time.monotonic() < deadline, 'the restarted service does not answer'\n"
        "        time.sleep(0.2)\n"
        '%tpu_serve'),
    new_code_cell("%tpu_logs lm --tail 2"),
    new_code_cell('with post({"prompt": "MENENIUS:\\n", "max_tokens": 48, "temperature": 0.8}) as answer:\n'
                  '    same = json.load(answer)["choices"][0]["text"] == completion["choices"][0]["text"]\n'
                  'print("the restarted server answers as before:", same)'),
    new_markdown_cell(
        "To restart it yourself: `%tpu_serve --stop lm`, then `%tpu_serve lm ...` again.\n\n"
        "## The slice's profile, through a forward\n\n"
        "Record a profile of 20 generate steps on the host with `jax.profiler`:"),
    new_code_cell(
        "%%on_tpu\nimport glob, socket\n\nwindow = jnp.zeros(CONTEXT, jnp.int32)\n"
        "next_token(model, window, 0.0, jax.random.key(0)).block_until_ready()   # compile first\n"
        "profile_dir = os.path.join(work, 'profile')\n"
        "with jax.profiler.trace(profile_dir, create_perfetto_trace=True):\n"
        "    for step in range(20):\n"
        "        window = jnp.append(window[1:], next_token(model, window, 0.0, jax.random.key(step)))\n"
        "    window.block_until_ready()\n"
        "print(sorted(os.path.basename(p).replace(socket.gethostname(), 'HOST')\n"
        "             for p in glob.glob(f'{profile_dir}/**/*.*', recursive=True)))"),
    new_markdown_cell(
        "Serve it with xprof (the profiler UI TensorBoard's profile plugin became; `pip install xprof` on the "
        "host, or `tpunb[xprof]`) as a second service, and reach it with `Slice.forward`, the Python form of "
        "`%tpu_forward`. xprof starts a gRPC worker too: give it a port of its own."),
    new_code_cell(
        "%tpu_serve xprof --hosts 0 --wait-http 16006/ -- exec xprof server --logdir $work/profile "
        "--port 16006 --grpc_port 16051\n"
        "xprof_url = sl.forward(16006)\nprint('open', xprof_url, 'for the trace viewer')"),
    new_markdown_cell("Its API answers through the same forward (gzip-compressed JSON): the profile's runs, "
                      "and the tools it offers for the one recorded here:"),
    new_code_cell(
        "import gzip\n\n\ndef xprof_api(path):\n"
        "    with urllib.request.urlopen(xprof_url + 'data/plugin/profile/' + path, timeout=60) as answer:\n"
        "        body = answer.read()\n"
        "    return json.loads(gzip.decompress(body) if answer.headers.get('Content-Encoding') == 'gzip' else body)\n\n\n"
        "runs = xprof_api('runs')\n"
        "print(len(runs), 'run;', 'tools:', ', '.join(xprof_api(f'run_tools?run={runs[0]}')))"),
    new_markdown_cell("## Stop\n\n`%tpu_serve --stop NAME` ends a service on every host; `%tpu_down` ends every "
                      "service of the slice with it."),
    new_code_cell("%tpu_serve --stop xprof\n%tpu_serve --stop lm\n%tpu_serve"),
    new_code_cell("%tpu_down\nimport shutil\n\nshutil.rmtree(work)   # this machine's copy of the model and the profile"),
    new_markdown_cell(
        "## The real thing: vLLM on a v6e-8\n\n"
        "The same commands serve a real model from a Cloud TPU v6e-8 (one host, 8 chips) with vLLM's TPU "
        "backend (`vllm-tpu`), whose `vllm serve` speaks the same OpenAI API on port 8000. Use its container "
        "(Docker is on the TPU VM image):\n\n"
        "```\n"
        "%tpu_launch v6e-8 --zone us-east5-b --name gemma\n"
        "%tpu_secret HF_TOKEN\n"
        "%tpu_fetch hf://google/gemma-4-31B-it\n"
        "%tpu_serve vllm --wait-http 8000/health --timeout 1800 -- "
        "sudo docker run --rm --name vllm --privileged --net host --shm-size 16G -v /dev/shm:/dev/shm -e HF_TOKEN "
        "-v ~/.cache/huggingface:/root/.cache/huggingface -v $VLLM_XLA_CACHE_PATH:$VLLM_XLA_CACHE_PATH "
        "-e VLLM_XLA_CACHE_PATH --entrypoint vllm vllm/vllm-tpu:latest "
        "serve google/gemma-4-31B-it --tensor-parallel-size 8 --max-model-len 16384 --port 8000\n"
        "url = %tpu_forward 8000\n"
        "%tpu_logs vllm --follow\n"
        "```\n\n"
        "or, without a container, `pip install vllm-tpu` on the host and serve it directly:\n\n"
        "```\n"
        "%tpu_run pip install vllm-tpu\n"
        "%tpu_serve vllm --wait-http 8000/health --timeout 1800 -- "
        "vllm serve google/gemma-4-31B-it --tensor-parallel-size 8 --max-model-len 16384 --port 8000\n"
        "url = %tpu_forward 8000\n"
        "```\n\n"
        "The `stream` function above measures it unchanged once `\"model\": \"google/gemma-4-31B-it\"` is added "
        "to the request body. `%tpu_fetch` puts the weights in each host's Hugging Face cache once per slice, "
        "which the container mounts where vLLM looks (a container has its own disk: without the mount it would "
        "download them again), with the host's compile cache (`VLLM_XLA_CACHE_PATH`, which tpunb sets on every "
        "host) so a restart does not compile again. The first start compiles for several minutes (hence "
        "`--timeout 1800`). `%tpu_secret HF_TOKEN` takes the token from this kernel's environment, Colab's "
        "secrets or a prompt that shows nothing, so it is never in a cell, the notebook or IPython's history; "
        "`%tpu_fetch` reads it from there, the hosts' services get it in their environment (`-e HF_TOKEN` hands "
        "it to the container) and it is masked (`****`, also as base64 or percent-encoded) in every log and "
        "output. `--env` is for settings that may be shown (`--env MODEL=...`); `--secret NAME` gives one "
        "command a secret. "
        "`%tpu_down` (or `--idle-delete`) ends the slice, and its $/h, when you are done."),
]

write("08_serve.ipynb", cells)
