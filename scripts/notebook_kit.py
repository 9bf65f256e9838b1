"""What every tutorial generator shares: the cells that open a tutorial in Colab, and writing a
notebook with its outputs stored by executing it in a real kernel (nbval compares them)."""
from __future__ import annotations

import os
import sys
import tempfile
import time

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

NOTEBOOKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "notebooks")
COLAB = "https://colab.research.google.com/github/tpunb/tpunb/blob/main/notebooks/"
BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
#: nbval runs the cell and ignores what it showed: only for views holding a run's timings (profiles)
IGNORE = {"tags": ["nbval-ignore-output"]}
#: the transformer block both training tutorials use (pre-norm causal self-attention and an MLP)
BLOCK = (
    "class Block(nnx.Module):\n"
    "    def __init__(self, d, heads, rngs):\n"
    "        self.heads = heads\n"
    "        self.norm1, self.norm2 = nnx.RMSNorm(d, rngs=rngs), nnx.RMSNorm(d, rngs=rngs)\n"
    "        self.qkv = nnx.Linear(d, 3 * d, use_bias=False, rngs=rngs)\n"
    "        self.proj = nnx.Linear(d, d, use_bias=False, rngs=rngs)\n"
    "        self.up = nnx.Linear(d, 4 * d, use_bias=False, rngs=rngs)\n"
    "        self.down = nnx.Linear(4 * d, d, use_bias=False, rngs=rngs)\n\n"
    "    def __call__(self, x):\n"
    "        b, t, d = x.shape\n"
    "        q, k, v = jnp.split(self.qkv(self.norm1(x)).reshape(b, t, 3 * self.heads, -1), 3, axis=2)\n"
    '        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1])\n'
    "        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)   # causal\n"
    '        x = x + self.proj(jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), v).reshape(b, t, d))\n'
    "        return x + self.down(jax.nn.gelu(self.up(self.norm2(x))))\n\n"
)
#: the JSON answer of both serving tutorials' servers (a method of their BaseHTTPRequestHandler)
JSON_REPLY = (
    "    def reply(self, answer, code=200):\n"
    "        data = json.dumps(answer).encode()\n"
    "        self.send_response(code)\n"
    '        self.send_header("Content-Type", "application/json")\n'
    '        self.send_header("Content-Length", str(len(data)))\n'
    "        self.end_headers()\n"
    "        self.wfile.write(data)\n\n"
)
KERNELSPEC = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}


def colab_cells(filename: str) -> list:
    """An "Open in Colab" badge, and a first cell that installs tpunb in Colab and does nothing elsewhere."""
    return [
        new_markdown_cell(f"[![Open In Colab]({BADGE})]({COLAB}{filename})"),
        new_code_cell('import sys\n\nif "google.colab" in sys.modules:  # in Colab: install tpunb; elsewhere: nothing\n'
                      "    %pip install -q tpunb"),
    ]


def write(filename: str, cells: list, execute: bool = True) -> str:
    """Prepend the Colab cells, execute the notebook (unless told not to) and write it to notebooks/."""
    from nbclient import NotebookClient

    notebook = new_notebook(cells=colab_cells(filename) + cells, metadata=dict(KERNELSPEC))
    path = os.path.abspath(os.path.join(NOTEBOOKS, filename))
    if execute:
        os.environ.setdefault("TPUNB_HOME", tempfile.mkdtemp(prefix="tpunb-notebook-"))
        os.environ["TPUNB_GROUP_WAIT"] = "60"  # lines grouped as nbval's run will (notebooks/conftest.py)
        started = time.monotonic()
        NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": NOTEBOOKS}}).execute()
        print(f"executed {filename} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    nbformat.write(notebook, path)
    print("wrote", path)
    return path
