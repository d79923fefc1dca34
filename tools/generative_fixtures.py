#!/usr/bin/env python3
"""Makes the generative fixtures of tests/generative/ (issue 34): a tiny GPT-2
with random weights exported to ONNX with its KV cache (past_key_values.N.key/
value inputs, present.N.key/value outputs), a byte-level BPE tokenizer trained
here on the repository's own text, and the reference tokens transformers'
greedy `generate` produces for 64 prompts of mixed lengths.

Weights cannot be downloaded: the model is built from a config with a fixed
seed, so its greedy outputs are arbitrary but deterministic. Needs torch,
transformers and tokenizers (tools/requirements-onnx.txt); the C++ tests only
read what this writes.

    tools/generative_fixtures.py [OUT_DIR]   (default tests/generative/fixtures)
"""
import json
import os
import pathlib
import sys

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

ROOT = pathlib.Path(__file__).resolve().parent.parent
VOCAB = 512
CONTEXT = 256
LAYERS, HEADS, EMBED = 2, 4, 64
EOS = "<|endoftext|>"


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


def export(model, path):
    head_dim = EMBED // HEADS
    ids = torch.randint(0, VOCAB, (1, 3))
    past = [torch.randn(1, HEADS, 2, head_dim) for _ in range(2 * LAYERS)]
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


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "tests/generative/fixtures")
    model_dir = out / "tiny_gpt2"
    version = model_dir / "1"
    version.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    tok = train_tokenizer()
    eos_id = tok.token_to_id(EOS)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=EMBED, n_layer=LAYERS,
                     n_head=HEADS, bos_token_id=eos_id, eos_token_id=eos_id,
                     initializer_range=0.3)
    model = GPT2LMHeadModel(cfg).eval()
    # The references first: tracing for the export leaves the module in a
    # state whose generate() differs from the exported graph (seen with
    # transformers 5.25: every first token shifted).
    print("greedy references for 64 prompts", flush=True)
    reference = references(model, tok)
    print("exporting", version / "model.onnx", flush=True)
    export(model, version / "model.onnx")
    tok.save(str(version / "tokenizer.json"))
    (version / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "model_max_length": CONTEXT,
         "tokenizer_class": "GPT2Tokenizer",
         "chat_template": "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"},
        indent=1) + "\n")
    (version / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eos_id, "eos_token_id": eos_id, "max_length": CONTEXT}, indent=1) + "\n")
    (version / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "vocab_size": VOCAB, "n_positions": CONTEXT, "n_embd": EMBED,
         "n_layer": LAYERS, "n_head": HEADS, "eos_token_id": eos_id}, indent=1) + "\n")
    (model_dir / "config.pbtxt").write_text(
        'name: "tiny_gpt2"\nbackend: "onnxruntime"\n'
        "model_transaction_policy { decoupled: true }\n")
    (out / "tiny_gpt2_reference.json").write_text(
        json.dumps({"model": "tiny_gpt2", "eos_id": eos_id, "cases": reference})
        + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
