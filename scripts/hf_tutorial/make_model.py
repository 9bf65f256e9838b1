import json, os, secrets
from importlib.resources import files

import ml_dtypes, numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

made = os.path.join(work, "made")             # the model as it is published
os.makedirs(made)
text = (files("tpunb") / "data" / "coriolanus.txt").read_text()   # Shakespeare, public domain

# a byte-level BPE tokenizer of 512 tokens (the text's characters, their commonest merges and Llama 3's chat markers)
SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
tokenizer.train_from_iterator([text], trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL, show_progress=False))
tokenizer.save(f"{made}/tokenizer.json")
chat_template = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                 "{{ m['content'] }}<|eot_id|>{% endfor %}"
                 "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[0], "eos_token": SPECIAL[3],
           "chat_template": chat_template}, open(f"{made}/tokenizer_config.json", "w"), indent=1)

# config.json as transformers writes it for a Llama 3.2: 2 layers, 4 query heads sharing 2 key/value heads (each
# 64 / 4 = 16 wide: no head_dim, it is derived), llama3 rope scaling, the embedding tied to the output, bf16
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 64},
          "hidden_act": "silu", "tie_word_embeddings": True, "bos_token_id": 0, "eos_token_id": 3,
          "torch_dtype": "bfloat16"}
json.dump(config, open(f"{made}/config.json", "w"), indent=1)

# the weights under Hugging Face's names, each linear layer [out, in], in bf16 (random: they stand in for a
# pretrained model), published as two shards and their index, as every model above a few GB is
d, ff, vocab, hd = 64, 128, 512, 16
shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,)}   # tied: no lm_head.weight
for i in range(2):
    attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
    shapes |= {f"{attn}.q_proj.weight": (4 * hd, d), f"{attn}.k_proj.weight": (2 * hd, d),
               f"{attn}.v_proj.weight": (2 * hd, d), f"{attn}.o_proj.weight": (d, 4 * hd),
               f"{mlp}.gate_proj.weight": (ff, d), f"{mlp}.up_proj.weight": (ff, d), f"{mlp}.down_proj.weight": (d, ff),
               f"model.layers.{i}.input_layernorm.weight": (d,), f"model.layers.{i}.post_attention_layernorm.weight": (d,)}
rng = np.random.default_rng(0)
weights = {name: (np.ones(shape) if len(shape) == 1 else
                  rng.normal(0, 1.0 if name.startswith("model.embed") else shape[1] ** -0.5, shape)).astype(ml_dtypes.bfloat16)
           for name, shape in shapes.items()}
files_of = {name: f"model-0000{1 if name.startswith(('model.embed', 'model.layers.0.')) else 2}-of-00002.safetensors"
            for name in weights}
for shard in sorted(set(files_of.values())):
    save_file({n: w for n, w in weights.items() if files_of[n] == shard}, f"{made}/{shard}", metadata={"format": "pt"})
json.dump({"metadata": {"total_size": sum(w.nbytes for w in weights.values())}, "weight_map": files_of},
          open(f"{made}/model.safetensors.index.json", "w"), indent=1)
for name in sorted(os.listdir(made)):
    print(f"{name:34} {os.path.getsize(os.path.join(made, name)):>8,} bytes")
print(f"{sum(w.size for w in weights.values()):,} parameters")
