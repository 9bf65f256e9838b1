"""The requests of each ``%tpu_bench`` level: every prompt distinct, in every level, so a prefix
cache answers none of them from another (vLLM caches prompts by blocks from the first token, on
by default).

- **Random tokens** (the default), as vLLM's random dataset makes them
  (``vllm/benchmarks/datasets/datasets.py`` ``RandomDataset``, v0.34.0): with a tokenizer's whole
  vocabulary, request *i* is the allowed ids from a random offset, ``(offset + i + k) % len``, decoded
  and re-encoded until it is the exact length. Through a server (its ``/tokenize`` and
  ``/detokenize``), whose vocabulary is only a sample, each id is drawn on its own.
- **Words**, when nothing tokenizes: words drawn on their own for each request (counted by the
  server's ``/tokenize`` when it has no ``/detokenize``, else one word a token, said in one line).
- **ShareGPT** (``--dataset FILE``, a local file in ShareGPT's format): the first turn of each
  conversation, as vLLM's ShareGPT dataset takes them (shuffled with the seed, lengths filtered).

Level *k* draws from ``seed + k``: a sweep never repeats a prompt. ``prefix_len`` tokens are shared
by every request of a level (vLLM's ``--random-prefix-len``), when sharing is what is measured. The
level's warm-ups are drawn with it, before its measured requests, so none is measured.
"""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Callable

from tpunb import report
from tpunb.transport.fanout import fan_out
from tpunb.errors import UsageError
from tpunb.bench.tokenizer import Tokenizer

#: the words prompts are made of when nothing tokenizes (common English: about a token each)
WORDS = ("the of and to in is that for it as with was on be by at this from have or are not but an "
         "which one all were when we there can more their if will out so up said what about into than "
         "them only other new some time could these two may first then do any like my now over such "
         "our man me even most made after also did many before must through back years where much your "
         "way well down should because each just those people how too little state good very make world").split()
#: decode/re-encode rounds before a prompt's length is taken as it is (vLLM's max_retry)
FIT_TRIES = 10
#: prompts made at once through a server's routes
PARALLEL = 16
#: ShareGPT's filter (vLLM's is_valid_sequence defaults)
MIN_LEN, MAX_PROMPT_LEN, MAX_TOTAL_LEN = 4, 1024, 2048


@dataclasses.dataclass
class Request:
    prompt: str
    input_len: int
    output_len: int

    def wire(self) -> dict:
        return {"prompt": self.prompt, "output_len": self.output_len}


def level_requests(tokenizer: Tokenizer | None, count: int, warmups: int, input_len: int, output_len: int | None,
                   prefix_len: int, seed: int, dataset: list[tuple[str, str]] | None = None
                   ) -> tuple[list[Request], list[Request]]:
    """(warm-ups, measured requests) of one level, drawn from ``seed``."""
    rng = random.Random(seed)
    total = count + warmups
    if dataset is not None:
        made = sharegpt(dataset, total, output_len, tokenizer, rng)
    elif tokenizer is not None and tokenizer.decode is not None:
        made = random_tokens(tokenizer, total, input_len, prefix_len, output_len or 0, rng)
    else:
        made = words(tokenizer, total, input_len, prefix_len, output_len or 0, rng)
    return made[:warmups], made[warmups:]


def random_tokens(tok: Tokenizer, count: int, input_len: int, prefix_len: int, output_len: int,
                  rng: random.Random) -> list[Request]:
    allowed = tok.allowed
    prefix = fit(tok, [rng.choice(allowed) for _ in range(prefix_len)], prefix_len, rng)[1] if prefix_len else []
    plans = []
    for i in range(count):
        if tok.whole:  # vLLM's: a rotation of the vocabulary from a random offset
            offset = rng.randrange(len(allowed))
            inner = [allowed[(offset + i + k) % len(allowed)] for k in range(input_len)]
        else:
            inner = [rng.choice(allowed) for _ in range(input_len)]
        plans.append((prefix + inner, random.Random(rng.getrandbits(64))))

    def one(plan) -> Request:
        text, ids = fit(tok, plan[0], prefix_len + input_len, plan[1])
        return Request(text, len(ids), output_len)

    if tok.whole:
        return [one(plan) for plan in plans]
    return fan_out(list(range(len(plans))), lambda i: one(plans[i]), workers=PARALLEL,
                   name="tpunb-bench-prompts").values()


def fit(tok: Tokenizer, ids: list[int], target: int, rng: random.Random) -> tuple[str, list[int]]:
    """Decode ``ids`` and encode the text again until it is ``target`` tokens (cut when longer,
    grown with allowed ids when shorter), at most FIT_TRIES rounds, as vLLM's
    ``gen_prompt_decode_to_target_len``: (the text, its ids)."""
    for tries in range(FIT_TRIES + 1):
        text = tok.decode(ids)
        ids = tok.encode(text)
        if len(ids) == target or tries == FIT_TRIES:
            break
        ids = ids[:target] if len(ids) > target else ids + [rng.choice(tok.allowed) for _ in range(target - len(ids))]
    return text, ids


def words(tok: Tokenizer | None, count: int, input_len: int, prefix_len: int, output_len: int,
          rng: random.Random) -> list[Request]:
    if tok is None:
        report.warn(f"[tpunb] no tokenizer: --input-len {input_len} counts words (give --tokenizer PATH, or serve "
                    "a model that answers POST /tokenize)")
    prefix = [rng.choice(WORDS) for _ in range(prefix_len)]
    made = []
    for _ in range(count):
        text = " ".join(prefix + [rng.choice(WORDS) for _ in range(input_len)])
        if tok is None:
            made.append(Request(text, prefix_len + input_len, output_len))
        else:
            fitted = _fit_words(text, prefix_len + input_len, tok.count, rng)
            made.append(Request(fitted, tok.count(fitted), output_len))
    return made


def _fit_words(text: str, target: int, counter: Callable[[str], int], rng: random.Random) -> str:
    """The longest start of ``text`` (grown first if short) that counts at most ``target`` tokens:
    a binary search over characters, a few dozen counts at most."""
    while counter(text) < target:
        text += " " + " ".join(rng.choice(WORDS) for _ in range(max(1, target)))
    low, high = 1, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if counter(text[:middle].rstrip()) <= target:
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip()


# -- ShareGPT ---------------------------------------------------------------------------------------
def read_sharegpt(path: str) -> list[tuple[str, str]]:
    """(first turn, second turn) of each conversation of a ShareGPT-format JSON file (a list of
    ``{"conversations": [{"from": ..., "value": ...}, ...]}``) with two turns or more."""
    where = Path(path).expanduser()
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"--dataset {path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UsageError(f"--dataset {path}: not JSON ({exc})") from None
    pairs = []
    for entry in data if isinstance(data, list) else []:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if isinstance(turns, list) and len(turns) >= 2 and all(isinstance(t, dict) for t in turns[:2]):
            pairs.append((str(turns[0].get("value", "")), str(turns[1].get("value", ""))))
    if not pairs:
        raise UsageError(f"--dataset {path}: no conversation of two turns or more (ShareGPT's format: a list of "
                         '{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]})')
    return pairs


def sharegpt(pairs: list[tuple[str, str]], count: int, output_len: int | None, tok: Tokenizer | None,
             rng: random.Random) -> list[Request]:
    """``count`` requests from the conversations, shuffled by ``rng``: a prompt's length as the
    tokenizer counts it (else words), the answer's as its output unless ``output_len`` is given;
    too short or too long pairs left out as vLLM leaves them; drawn again at random when too few."""
    count_tokens = tok.count if tok is not None else (lambda text: len(text.split()))
    order = list(pairs)
    rng.shuffle(order)
    made = []
    for prompt, answer in order:
        if len(made) >= count:
            break
        prompt_len = count_tokens(prompt)
        out = output_len if output_len is not None else count_tokens(answer)
        if prompt_len < MIN_LEN or prompt_len > MAX_PROMPT_LEN or prompt_len + out > MAX_TOTAL_LEN or (
                output_len is None and out < MIN_LEN):
            continue
        made.append(Request(prompt, prompt_len, out))
    if not made:
        raise UsageError(f"--dataset: none of its {len(pairs)} conversations has a prompt of {MIN_LEN} to "
                         f"{MAX_PROMPT_LEN} tokens and at most {MAX_TOTAL_LEN} with its answer")
    while len(made) < count:
        made.append(rng.choice(made[:len(made)]))
    return made
