"""Writes notebooks/03_planning.ipynb and executes it to store its outputs (nbval compares them):
PYTHONPATH=. python3 scripts/make_planning_notebook.py"""
from nbformat.v4 import new_code_cell, new_markdown_cell

from notebook_kit import write

cells = [
    new_markdown_cell(
        '# Planning: which TPU, how long, how much\n'
        '\n'
        'Before launching anything, tpunb can answer the three budgeting questions in one line:\n'
        '**which TPU fits my model, how long will it take, and what will it cost?**\n'
        '\n'
        'Nothing here talks to Google Cloud. The numbers come from `tpunb/data/catalog.json` (every Cloud TPU\n'
        'generation, with the sources of each figure) and the method is the one of\n'
        '[How to Scale Your Model](https://jax-ml.github.io/scaling-book/): count parameters and FLOPs,\n'
        'put memory per component next to HBM, and compare compute time with HBM and ICI time to find what\n'
        'bounds each step.\n'
        '\n'
        'Nothing here needs a slice. To act on a plan, configure a Google Cloud project and launch what it recommends on a real slice, e.g. `%tpu_launch v6e-4 --zone us-east5-b` (or rehearse it on a local simulated slice first: `%tpu_launch v6e-4` without a project).'),
    new_code_cell(
        '%load_ext tpunb'),
    new_markdown_cell(
        '## The catalog\n'
        '\n'
        '`%tpu_catalog` takes generations, zones or slice names and returns a pandas DataFrame.'),
    new_code_cell(
        '%tpu_catalog v5e'),
    new_markdown_cell(
        'The same data from Python; other parts of tpunb (the simulated slice, the Cloud TPU emulator) read it too.'),
    new_code_cell(
        'from tpunb.catalog import lookup\n'
        '\n'
        'acc = lookup("tpu-v4-32")\n'
        'acc.name, acc.chips, acc.hosts, acc.devices_per_host, acc.topology, acc.price_per_hour(), acc.zones'),
    new_markdown_cell(
        'A name that does not exist fails in one line, with the sizes that do:'),
    new_code_cell(
        'from tpunb.errors import TpunbError\n'
        '\n'
        'for name in ["v4-17", "v5lightpod-8"]:\n'
        '    try:\n'
        '        lookup(name)\n'
        '    except TpunbError as error:\n'
        '        print(error)'),
    new_markdown_cell(
        '## Plan a fine-tune\n'
        '\n'
        'A LoRA fine-tune of Llama 3 8B (rank 16 on the query and value projections) on 500M tokens,\n'
        '256K tokens per step in sequences of 4096. For each generation asked for, the plan keeps the\n'
        'smallest slice that holds the job and reports the mesh, what bounds a step, the time and the cost.'),
    new_code_cell(
        '%tpu_plan llama3-8b --lora 16 --batch 256K --seq 4096 --tokens 500M --tpu v5e,v6e,v5p'),
    new_markdown_cell(
        'From Python, `plan()` returns a dataclass; its tables are DataFrames.'),
    new_code_cell(
        'from tpunb.plan import plan\n'
        '\n'
        'finetune = plan("llama3-8b", lora_rank=16, batch_tokens="256K", seq_len=4096, tokens="500M", tpu="v5e,v6e,v5p")\n'
        'finetune.memory_table().round(2)'),
    new_code_cell(
        'best = finetune.best()\n'
        'print(best.accelerator, best.mesh, f"{best.total_hours:.1f} h", f"${best.cost_usd:,.0f}")\n'
        'print(best.reason)'),
    new_markdown_cell(
        '## Plan a serving deployment\n'
        '\n'
        'Llama 3 70B with int8 weights and KV cache, 64 concurrent sequences of up to 8192 tokens. Decode is\n'
        'HBM-bound at this batch: every step reads the weights and the KV cache once.'),
    new_code_cell(
        '%tpu_plan llama3-70b --serve --weights int8 --batch 64 --context 8192 --tpu v5e,v6e,v5p'),
    new_markdown_cell(
        'The smallest slice is rarely the cheapest per token: a larger slice reads the same bytes from more HBM at once. `Plan.on()` puts the same workload on any slice.'),
    new_code_cell(
        'import pandas as pd\n'
        '\n'
        'serve = plan("llama3-70b", "serve", weight_dtype="int8", batch=64, context=8192)\n'
        'slices = ["v5litepod-8", "v5litepod-16", "v6e-8", "v6e-16", "v5p-16"]\n'
        'pd.DataFrame(\n'
        '    {\n'
        '        name: {\n'
        '            "fits": o.fits,\n'
        '            "mesh": str(o.mesh),\n'
        '            "decode ms": round(o.step_seconds * 1e3, 1),\n'
        '            "tokens/s": round(o.tokens_per_second),\n'
        '            "$/1M tokens": round(o.usd_per_million_tokens, 2),\n'
        '        }\n'
        '        for name in slices\n'
        '        for o in [serve.on(name)]\n'
        '    }\n'
        ').T'),
    new_markdown_cell(
        '## Compare generations by cost\n'
        '\n'
        'Pretraining an 8B model on 160B tokens (about 20 tokens per parameter), 4M tokens per step.\n'
        'Compute-bound training costs about the same on any slice size of one generation, so the\n'
        'generation is the choice that matters. `table()` holds plain numbers for sorting.'),
    new_code_cell(
        'pretrain = plan("llama3-8b", batch_tokens="4M", seq_len=8192, tokens="160B")\n'
        'columns = ["chips", "mesh", "bound", "total_h", "cost_usd", "spot_cost_usd"]\n'
        'pretrain.table()[columns].sort_values("cost_usd").round(1)'),
    new_markdown_cell(
        'With a deadline, each generation grows to the smallest slice that finishes in time:'),
    new_code_cell(
        '%tpu_plan llama3-8b --batch 4M --seq 8192 --tokens 160B --deadline 7d --tpu v5e,v6e,v5p'),
    new_markdown_cell(
        '## What the estimates leave out\n'
        '\n'
        '- The target MFU (40% by default for training) stands for every inefficiency; real runs vary.\n'
        '- Attention is assumed to be flash attention; sliding-window layers are costed as full attention.\n'
        '- One slice only: multislice over the data-center network is not modelled.\n'
        '- TPU7x (Ironwood) has no public list price yet, so it shows times without costs.'),
]

write("03_planning.ipynb", cells)
