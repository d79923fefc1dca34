#!/usr/bin/env python3
"""Makes the generative fixtures of tests/generative/ (issue 34): tiny decoders
with random weights exported to ONNX with their KV cache (past_key_values.N.key/
value inputs, present.N.key/value outputs), a byte-level BPE tokenizer trained
here on the repository's own text, and for each model the reference tokens
transformers' greedy `generate` produces for 64 prompts of mixed lengths
(`<model>_reference.json`). The models, one per architecture the engine must
run token for token:

    tiny_gpt2    GPT-2: learned positions, LayerNorm, GELU, fused QKV
    tiny_llama   Llama: grouped-query attention (2 KV heads for 4 query heads),
                 RoPE, RMSNorm, SiLU-gated MLP
    tiny_qwen2   Qwen2: as Llama, with biases on the Q, K and V projections

Weights cannot be downloaded: each model is built from a config with a fixed
seed, so its greedy outputs are arbitrary but deterministic. Needs torch,
transformers and tokenizers (tools/requirements-onnx.txt); the C++ tests only
read what this writes.

    tools/generative_fixtures.py [OUT_DIR [MODEL...]]
        (default tests/generative/fixtures and every model)
"""
import json
import os
import pathlib
import sys

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM)

ROOT = pathlib.Path(__file__).resolve().parent.parent
VOCAB = 512
CONTEXT = 256
LAYERS, HEADS, EMBED = 2, 4, 64
KV_HEADS = 2      # Llama and Qwen2: grouped-query attention, two query heads per KV head
INTERMEDIATE = 128
# Far above the 0.02 of real checkpoints, so that greedy outputs vary.
LLAMA_INIT = 0.3
EOS = "<|endoftext|>"


class Arch:
    """What differs between the models: how to build one, its KV heads, and
    the config.json the server reads (max_context from its positions)."""

    def __init__(self, name, build, kv_heads, config_json):
        self.name = name
        self.build = build
        self.kv_heads = kv_heads
        self.config_json = config_json


def gpt2(eos_id):
    # initializer_range well above GPT-2's 0.02 so that greedy outputs vary.
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=CONTEXT, n_embd=EMBED, n_layer=LAYERS, n_head=HEADS,
        bos_token_id=eos_id, eos_token_id=eos_id, initializer_range=0.3))


def llama_like(config_class, model_class, initializer_range):
    def build(eos_id):
        return model_class(config_class(
            vocab_size=VOCAB, hidden_size=EMBED, intermediate_size=INTERMEDIATE,
            num_hidden_layers=LAYERS, num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS, max_position_embeddings=CONTEXT,
            bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
            tie_word_embeddings=False, initializer_range=initializer_range))
    return build


def llama_config_json(model_type):
    def config(eos_id):
        return {"model_type": model_type, "vocab_size": VOCAB, "hidden_size": EMBED,
                "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
                "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
                "max_position_embeddings": CONTEXT, "eos_token_id": eos_id}
    return config


ARCHS = {a.name: a for a in [
    Arch("tiny_gpt2", gpt2, HEADS, lambda eos_id: {
        "model_type": "gpt2", "vocab_size": VOCAB, "n_positions": CONTEXT, "n_embd": EMBED,
        "n_layer": LAYERS, "n_head": HEADS, "eos_token_id": eos_id}),
    Arch("tiny_llama", llama_like(LlamaConfig, LlamaForCausalLM, LLAMA_INIT),
         KV_HEADS, llama_config_json("llama")),
    Arch("tiny_qwen2", llama_like(Qwen2Config, Qwen2ForCausalLM, LLAMA_INIT),
         KV_HEADS, llama_config_json("qwen2")),
]}


def corpus():
    """The repository's own prose, so that the tokenizer learns real merges."""
    texts = []
    for pattern in ("*.md", "docs/*.md"):
        for path in sorted(ROOT.glob(pattern)):
            texts.append(path.read_text(encoding="utf-8"))
    return texts


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return tok


class WithCache(torch.nn.Module):
    """Flat past/present tensors around transformers' cache object."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache()
        for i in range(LAYERS):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=cache, use_cache=True)
        result = [out.logits]
        for layer in out.past_key_values.layers:
            result += [layer.keys, layer.values]
        return tuple(result)


def export(model, kv_heads, path):
    head_dim = EMBED // HEADS
    ids = torch.randint(0, VOCAB, (1, 3))
    past = [torch.randn(1, kv_heads, 2, head_dim) for _ in range(2 * LAYERS)]
    mask = torch.ones(1, 5, dtype=torch.int64)
    pos = torch.arange(2, 5).unsqueeze(0)
    past_names = [f"past_key_values.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]
    present_names = [f"present.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]
    dynamic = {"input_ids": {0: "batch", 1: "sequence"},
               "attention_mask": {0: "batch", 1: "total"},
               "position_ids": {0: "batch", 1: "sequence"},
               "logits": {0: "batch", 1: "sequence"}}
    for name in past_names:
        dynamic[name] = {0: "batch", 2: "past"}
    for name in present_names:
        dynamic[name] = {0: "batch", 2: "total"}
    torch.onnx.export(WithCache(model), (ids, mask, pos, *past), str(path),
                      input_names=["input_ids", "attention_mask", "position_ids"] + past_names,
                      output_names=["logits"] + present_names, dynamic_axes=dynamic,
                      opset_version=17, dynamo=False)


def references(model, tok):
    """64 prompts of mixed lengths, each with its own max_tokens, greedy."""
    rng = np.random.RandomState(7)
    lines = [l for text in corpus() for l in text.splitlines() if len(l.split()) >= 3]
    cases = []
    for i in range(64):
        line = lines[rng.randint(len(lines))]
        ids = tok.encode(line).ids[: int(rng.randint(1, 48))]
        max_tokens = int(rng.randint(1, 33))
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                 dtype=torch.int64), max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, do_sample=False,
                                 output_scores=True, return_dict_in_generate=True,
                                 pad_token_id=0)
        generated = out.sequences[0, len(ids):].tolist()
        # The gap between the two best logits at each step: a step within 1e-4
        # may legitimately differ after float reassociation (issue 34).
        gaps = []
        for scores in out.scores:
            top = torch.topk(scores[0], 2).values
            gaps.append(float(top[0] - top[1]))
        # The text a stream of these tokens shows after the prompt's (as
        # vLLM detokenizes): decode(prompt + generated) less decode(prompt).
        prompt_text = tok.decode(ids)
        whole = tok.decode(ids + generated)
        text = whole[len(prompt_text):] if whole.startswith(prompt_text) else None
        cases.append({"prompt": prompt_text, "prompt_ids": ids, "max_tokens": max_tokens,
                      "generated_ids": generated, "generated_text": text,
                      "prompt_roundtrips": tok.encode(prompt_text).ids == ids,
                      "top2_gaps": gaps})
    return cases


def write_model(out, arch, tok):
    model_dir = out / arch.name
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    eos_id = tok.token_to_id(EOS)
    torch.manual_seed(0)
    model = arch.build(eos_id).eval()
    # The references first: tracing for the export leaves the module in a
    # state whose generate() differs from the exported graph (seen with
    # transformers 5.25: every first token shifted).
    print(arch.name + ": greedy references for 64 prompts", flush=True)
    reference = references(model, tok)
    print(arch.name + ": exporting", version / "model.onnx", flush=True)
    export(model, arch.kv_heads, version / "model.onnx")
    tok.save(str(version / "tokenizer.json"))
    (version / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "model_max_length": CONTEXT,
         "tokenizer_class": "GPT2Tokenizer",
         "chat_template": "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"},
        indent=1) + "\n")
    (version / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eos_id, "eos_token_id": eos_id, "max_length": CONTEXT}, indent=1) + "\n")
    (version / "config.json").write_text(json.dumps(arch.config_json(eos_id), indent=1) + "\n")
    (model_dir / "config.pbtxt").write_text(
        f'name: "{arch.name}"\nbackend: "onnxruntime"\n'
        "model_transaction_policy { decoupled: true }\n")
    (out / f"{arch.name}_reference.json").write_text(
        json.dumps({"model": arch.name, "eos_id": eos_id, "cases": reference})
        + "\n")


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "tests/generative/fixtures")
    names = sys.argv[2:] or list(ARCHS)
    unknown = [n for n in names if n not in ARCHS]
    if unknown:
        sys.exit(f"unknown model {unknown}: choose from {list(ARCHS)}")
    # Every model shares one tokenizer. Training it again would learn other
    # merges whenever the repository's prose has changed, so the one already
    # written is kept.
    shared = out / "tiny_gpt2/1/tokenizer.json"
    tok = Tokenizer.from_file(str(shared)) if shared.exists() else train_tokenizer()
    for name in names:
        write_model(out, ARCHS[name], tok)
    print("wrote", out)


if __name__ == "__main__":
    main()
