"""An OpenAI-style server for the tiny Llama and its LoRA adapter, started as `vllm serve` is:
`python3 server.py serve ORG/NAME --port P --enable-lora --lora-modules NAME=PATH`. The model comes
from the Hugging Face cache by its id, as vllm finds it; chats go through the tokenizer's chat
template. It answers GET /v1/models, POST /tokenize, /v1/completions and /v1/chat/completions; with
"stream": true one server-sent event per token, and a last chunk with the usage when
stream_options.include_usage asks."""
import argparse, json, os, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jax, jax.numpy as jnp, jinja2
from huggingface_hub import snapshot_download
from safetensors.numpy import load_file
from tokenizers import Tokenizer

import llama

parser = argparse.ArgumentParser(prog="server.py")
parser.add_argument("command", choices=["serve"])
parser.add_argument("model")
parser.add_argument("--port", type=int, default=8000)
parser.add_argument("--enable-lora", action="store_true")
parser.add_argument("--max-lora-rank", type=int, default=16)
parser.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH")
parser.add_argument("--tensor-parallel-size", type=int, default=1)   # taken as vllm takes it: the toy runs on one
parser.add_argument("--max-model-len", type=int, default=None)       # device and sees its own CONTEXT tokens
args = parser.parse_args()
BASE, CONTEXT = args.model, 64   # tokens the model sees at a time
# where %tpu_fetch put it on this host; vLLM too asks for the files it reads, by pattern (not original/*)
base = snapshot_download(BASE, local_files_only=True, allow_patterns=["*.json", "*.safetensors"])
config, weights = llama.load(base)
tokenizer = Tokenizer.from_file(os.path.join(base, "tokenizer.json"))
special = json.load(open(os.path.join(base, "tokenizer_config.json")))
template = jinja2.Environment().from_string(special["chat_template"])
if len(args.lora_modules) != 1 or not args.enable_lora:
    parser.error("give --enable-lora and one --lora-modules NAME=PATH")
lora_name, lora_dir = args.lora_modules[0].split("=", 1)
lora_dir = os.path.expanduser(lora_dir)
settings = json.load(open(os.path.join(lora_dir, "adapter_config.json")))
if settings["r"] > args.max_lora_rank:
    parser.error(f"the adapter's rank {settings['r']} is above --max-lora-rank {args.max_lora_rank}")
tensors = load_file(os.path.join(lora_dir, "adapter_model.safetensors"))
scale = settings["lora_alpha"] / settings["r"]
lora = {name.removeprefix("base_model.model.").removesuffix(".lora_A.weight"):
        (jnp.asarray(a), jnp.asarray(tensors[name.replace("lora_A", "lora_B")]), scale)
        for name, a in tensors.items() if name.endswith(".lora_A.weight")}
# the base model is the adapter at scale 0, so one compiled program serves both (--lora-modules NAME=PATH)
MODELS = {BASE: {name: (a, b, 0.0) for name, (a, b, _) in lora.items()}, lora_name: lora}
port = args.port
lock = threading.Lock()   # one step at a time: this server does not batch requests (vLLM does)


@jax.jit
def next_token(lora, window, pad, temperature, key):
    logits = llama.forward(config, weights, lora, window[None], pad)[0, -1]
    sampled = jax.random.categorical(key, logits / jnp.maximum(temperature, 1e-6))
    return jnp.where(temperature > 0, sampled, jnp.argmax(logits))   # greedy at temperature 0


def generate(model, ids, max_tokens, temperature=0.0, seed=0):
    ids, key = list(ids), jax.random.key(seed)
    for step in range(max_tokens):
        window = ids[-CONTEXT:]
        with lock:
            token = int(next_token(MODELS[model], jnp.array([0] * (CONTEXT - len(window)) + window),
                                   CONTEXT - len(window), temperature, jax.random.fold_in(key, step)))
        ids.append(token)
        yield token


def prompt_of(body, chat):
    """The text the model continues: a chat's messages through the chat template of tokenizer_config.json."""
    if not chat:
        return body.get("prompt", "")
    return template.render(messages=body.get("messages", []), bos_token=special["bos_token"], add_generation_prompt=True)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/v1/models":
            return self.reply({"object": "list", "data": [{"id": m, "object": "model", "root": BASE if m == BASE else lora_dir,
                                                           "parent": None if m == BASE else BASE} for m in MODELS]})
        self.reply({"status": "ok"})   # /health, which --wait-http asks

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        chat = self.path == "/v1/chat/completions"
        if self.path == "/tokenize":   # vLLM's: how many tokens a prompt is (%tpu_bench --input-len asks)
            ids = tokenizer.encode(prompt_of(body, "messages" in body)).ids
            return self.reply({"count": len(ids), "tokens": ids, "max_model_len": CONTEXT})
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self.reply({"error": {"message": f"no route {self.path}"}}, 404)
        model = body.get("model", BASE)
        if model not in MODELS:
            return self.reply({"error": {"message": f"the model {model} does not exist", "code": 404}}, 404)
        ids = tokenizer.encode(prompt_of(body, chat)).ids
        n = int(body.get("max_tokens", 16))   # it has no end-of-sequence: every answer is max_tokens long
        sampling = float(body.get("temperature", 0.0)), int(body.get("seed", 0))
        usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
        kind, rid = ("chat.completion", "chatcmpl-1") if chat else ("text_completion", "cmpl-1")
        if not body.get("stream"):
            text = tokenizer.decode(list(generate(model, ids, n, *sampling)))
            choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            return self.reply({"id": rid, "object": kind, "model": model, "usage": usage,
                               "choices": [{"index": 0, **choice, "finish_reason": "length"}]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        made, shown = [], ""
        for token in generate(model, ids, n, *sampling):   # one event per token, sent as soon as it is made
            made.append(token)
            text = tokenizer.decode(made)
            piece, shown = text[len(shown):], text
            choice = {"delta": {"content": piece}} if chat else {"text": piece}
            self.event({"id": rid, "object": kind + (".chunk" if chat else ""), "model": model,
                        "choices": [{"index": 0, **choice, "finish_reason": None}]})
        if (body.get("stream_options") or {}).get("include_usage"):   # the usage chunk: no choices
            self.event({"id": rid, "object": kind + (".chunk" if chat else ""), "model": model, "choices": [],
                        "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")

    def event(self, value):
        self.wfile.write(b"data: " + json.dumps(value).encode() + b"\n\n")
        self.wfile.flush()

    def reply(self, answer, code=200):
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):   # the service's log: completions only, without the clock
        if self.path.endswith("completions"):
            print(self.command, self.path, args[1], flush=True)


for model in MODELS:   # compile before answering: readiness means fast answers
    list(generate(model, [0], 1))
print(f"serving {BASE} and {lora_name} (LoRA r={settings['r']}) on port {port}", flush=True)
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
