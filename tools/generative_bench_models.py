#!/usr/bin/env python3
"""Makes the models of the generative benchmark (issue 35, bench/generate/run) into a cache
folder: nothing of this is committed. Random weights (no weights can be downloaded), built
from a config with a fixed seed, and a byte-level BPE tokenizer trained here on the
repository's own text and code:

    gpt2      GPT-2 small: 12 layers, 768 wide, 12 heads, vocabulary 50257, 1024 positions
              (124M parameters, tied embeddings)
    llama     Llama architecture: 16 layers, 1024 wide, 16 query heads and 4 KV heads
              (grouped-query attention), SiLU MLP 2816, vocabulary 32000, 2048 positions
              (about 245M parameters)

`--quick` makes small ones with the same vocabularies (gpt2: 4 layers, 256 wide;
llama: 4 layers, 256 wide, 8 query and 2 KV heads, MLP 704), for bench/generate/run --quick.

Each model is written in every engine's format, from the same weights:

    OUT/hf/<m>/              transformers' save_pretrained + the tokenizer (the converters' input)
    OUT/genai/<m>/           onnxruntime-genai's files: for llama its model builder's output
                             (GroupQueryAttention, fp32); for gpt2 (which the builder does not
                             take) the torch export below with a genai_config.json written here
    OUT/caf/<m>/             caf-serving's repository: gpt2 exported by torch.onnx.export with
                             past/present (as tools/generative_fixtures.py exports the test
                             models); llama the builder's files (hard links). So both engines
                             run the same ONNX files.
    OUT/gguf/<m>.gguf        llama.cpp's converter (convert_hf_to_gguf.py) at f32, when
                             --llama-cpp SRC names its source tree

    tools/generative_bench_models.py OUT [--quick] [--llama-cpp SRC] [--python PY]

A model already complete in OUT (its files present) is not made again.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
EOS = "<|endoftext|>"

FULL = {
    "gpt2": dict(arch="gpt2", vocab=50257, layers=12, width=768, heads=12, kv_heads=12,
                 context=1024),
    "llama": dict(arch="llama", vocab=32000, layers=16, width=1024, heads=16, kv_heads=4,
                  intermediate=2816, context=2048),
}
QUICK = {
    "gpt2": dict(arch="gpt2", vocab=50257, layers=4, width=256, heads=4, kv_heads=4,
                 context=1024),
    "llama": dict(arch="llama", vocab=32000, layers=4, width=256, heads=8, kv_heads=2,
                  intermediate=704, context=2048),
}


def log(*args):
    print("[models]", *args, flush=True)


def corpus():
    """The repository's tracked prose and code: about 6 MB, enough for 50k merges."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in sorted(files):
        if f.endswith((".md", ".cpp", ".hpp", ".py", ".txt", ".cmake", ".pbtxt")):
            try:
                yield (ROOT / f).read_text(encoding="utf-8")
            except (UnicodeDecodeError, FileNotFoundError):
                pass


def train_tokenizer(vocab, path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    if path.exists():
        return Tokenizer.from_file(str(path))
    log(f"training a byte-level BPE tokenizer of {vocab} tokens on the repository's text")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    learned = tok.get_vocab_size()
    # The corpus runs out of pairs before 50k merges (about 29k here): the rest of the
    # vocabulary is plain added tokens "<tNNNNN>", so that every id a random model samples
    # decodes to text in every engine.
    if learned < vocab:
        tok.add_tokens([f"<t{i}>" for i in range(learned, vocab)])
    log(f"  learned {learned} tokens, {tok.get_vocab_size() - learned} added as <tNNNNN> "
        f"to fill the model's vocabulary of {vocab}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return tok


def build_model(spec):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    if spec["arch"] == "gpt2":
        cfg = GPT2Config(vocab_size=spec["vocab"], n_positions=spec["context"],
                         n_embd=spec["width"], n_layer=spec["layers"], n_head=spec["heads"],
                         bos_token_id=0, eos_token_id=0)
        model = GPT2LMHeadModel(cfg)
    else:
        cfg = LlamaConfig(vocab_size=spec["vocab"], hidden_size=spec["width"],
                          intermediate_size=spec["intermediate"],
                          num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
                          num_key_value_heads=spec["kv_heads"],
                          max_position_embeddings=spec["context"], bos_token_id=0,
                          eos_token_id=0, pad_token_id=0, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
    return model.eval()


class WithCache:
    """Flat past/present tensors around transformers' cache object (as
    tools/generative_fixtures.py exports the test models)."""

    @staticmethod
    def module(model, layers):
        import torch
        from transformers import DynamicCache

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask, position_ids, *past):
                cache = DynamicCache()
                for i in range(layers):
                    cache.update(past[2 * i], past[2 * i + 1], i)
                out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids, past_key_values=cache,
                                 use_cache=True)
                result = [out.logits]
                for layer in out.past_key_values.layers:
                    result += [layer.keys, layer.values]
                return tuple(result)
        return M()


def export_onnx(model, spec, path):
    import torch
    layers, head_dim = spec["layers"], spec["width"] // spec["heads"]
    ids = torch.randint(0, 100, (1, 3))
    past = [torch.randn(1, spec["kv_heads"], 2, head_dim) for _ in range(2 * layers)]
    mask = torch.ones(1, 5, dtype=torch.int64)
    pos = torch.arange(2, 5).unsqueeze(0)
    past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present_names = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    dynamic = {"input_ids": {0: "batch", 1: "sequence"},
               "attention_mask": {0: "batch", 1: "total"},
               "position_ids": {0: "batch", 1: "sequence"},
               "logits": {0: "batch", 1: "sequence"}}
    for name in past_names:
        dynamic[name] = {0: "batch", 2: "past"}
    for name in present_names:
        dynamic[name] = {0: "batch", 2: "total"}
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(WithCache.module(model, layers), (ids, mask, pos, *past), str(path),
                          input_names=["input_ids", "attention_mask", "position_ids"]
                          + past_names,
                          output_names=["logits"] + present_names, dynamic_axes=dynamic,
                          opset_version=17, dynamo=False)


def tokenizer_files(tok_file, dst, context):
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(tok_file, dst / "tokenizer.json")
    (dst / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS, "model_max_length": context,
         "add_bos_token": False, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=1) + "\n")
    (dst / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 0, "max_length": context}, indent=1) + "\n")


def caf_config(name, model_dir, spec):
    (model_dir / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\n'
        "model_transaction_policy { decoupled: true }\n"
        'parameters { key: "max_sequences" value: { string_value: "64" } }\n')


def gpt2_genai_config(spec):
    """onnxruntime-genai's config for the torch export (a decoder with past/present of
    growing length, no shared buffer): the builder does not take GPT-2."""
    layers = spec["layers"]
    return {"model": {
        "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
        "context_length": spec["context"], "vocab_size": spec["vocab"], "type": "llama",
        "decoder": {
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "filename": "model.onnx", "head_size": spec["width"] // spec["heads"],
            "hidden_size": spec["width"], "num_attention_heads": spec["heads"],
            "num_key_value_heads": spec["kv_heads"], "num_hidden_layers": layers,
            "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                       "position_ids": "position_ids",
                       "past_key_names": "past_key_values.%d.key",
                       "past_value_names": "past_key_values.%d.value"},
            "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                        "present_value_names": "present.%d.value"}}},
        "search": {"do_sample": False, "max_length": spec["context"], "min_length": 0,
                   "num_beams": 1, "num_return_sequences": 1, "past_present_share_buffer":
                   False, "temperature": 1.0, "top_k": 1, "top_p": 1.0,
                   "repetition_penalty": 1.0, "early_stopping": True, "length_penalty": 1.0,
                   "no_repeat_ngram_size": 0, "diversity_penalty": 0.0}}


def gguf(name, hf_dir, out_file, llama_src, python):
    """llama.cpp's converter, with its tokenizer check told that this locally trained
    byte-level BPE pre-tokenizes as GPT-2's does (it does: the same ByteLevel regex), and
    for Llama that there is no SentencePiece model (it tries one first)."""
    if out_file.exists():
        return
    log(f"{name}: converting to GGUF (f32) with {llama_src}/convert_hf_to_gguf.py")
    shim = (
        "import sys, runpy\n"
        f"sys.path.insert(0, {str(llama_src / 'gguf-py')!r})\n"
        f"sys.path.insert(0, {str(llama_src)!r})\n"
        "import conversion.base as b\n"
        "b.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
        "def no_sp(self): raise FileNotFoundError('no tokenizer.model: byte-level BPE')\n"
        "b.TextModel._set_vocab_sentencepiece = no_sp\n"
        "import convert_hf_to_gguf as c\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {str(hf_dir)!r}, '--outtype', 'f32',"
        f" '--outfile', {str(out_file)!r}]\n"
        "c.main()\n")
    out_file.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-c", shim], check=True)


def make(out, quick, llama_src, python):
    import torch
    from transformers import PreTrainedTokenizerFast
    specs = QUICK if quick else FULL
    torch.set_num_threads(2)
    for name, spec in specs.items():
        tok_file = out / "tokenizers" / f"{spec['vocab']}.json"
        train_tokenizer(spec["vocab"], tok_file)
        hf = out / "hf" / name
        caf_dir = out / "caf" / name
        genai_dir = out / "genai" / name
        model = None
        if not (hf / "config.json").exists():
            model = build_model(spec)
            n = sum(p.numel() for p in model.parameters())
            log(f"{name}: {n / 1e6:.1f}M parameters, saving {hf}")
            model.save_pretrained(hf)
            if spec["arch"] == "gpt2":
                # llama.cpp's converter reads GPT-2's context as n_ctx, which transformers 5
                # no longer writes.
                cfg = json.loads((hf / "config.json").read_text())
                cfg["n_ctx"] = cfg["n_positions"]
                (hf / "config.json").write_text(json.dumps(cfg, indent=1))
            PreTrainedTokenizerFast(tokenizer_file=str(tok_file), eos_token=EOS,
                                    bos_token=EOS).save_pretrained(hf)
        if spec["arch"] == "gpt2" and not (caf_dir / "1" / "model.onnx").exists():
            if model is None:
                from transformers import AutoModelForCausalLM
                model = AutoModelForCausalLM.from_pretrained(hf).eval()
            log(f"{name}: torch.onnx.export with past/present -> {caf_dir}/1/model.onnx")
            export_onnx(model, spec, caf_dir / "1" / "model.onnx.tmp")
            (caf_dir / "1" / "model.onnx.tmp").rename(caf_dir / "1" / "model.onnx")
            tokenizer_files(tok_file, caf_dir / "1", spec["context"])
            (caf_dir / "1" / "config.json").write_text(
                json.dumps(json.loads((hf / "config.json").read_text()), indent=1))
            caf_config(name, caf_dir, spec)
        if not (genai_dir / "genai_config.json").exists():
            if spec["arch"] == "llama":
                log(f"{name}: onnxruntime-genai's model builder (fp32, cpu) -> {genai_dir}")
                tmp = out / "genai" / f"{name}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                subprocess.run([python, "-m", "onnxruntime_genai.models.builder", "-i", str(hf),
                                "-o", str(tmp), "-p", "fp32", "-e", "cpu",
                                "-c", str(out / "genai" / "cache")], check=True)
                shutil.rmtree(genai_dir, ignore_errors=True)
                tmp.rename(genai_dir)
            else:
                genai_dir.mkdir(parents=True, exist_ok=True)
                for f in (caf_dir / "1").iterdir():
                    if f.name.startswith("model.onnx") or f.name.startswith("tokenizer"):
                        dst = genai_dir / f.name
                        if not dst.exists():
                            os.symlink(f, dst)
                (genai_dir / "genai_config.json").write_text(
                    json.dumps(gpt2_genai_config(spec), indent=1) + "\n")
        if spec["arch"] == "llama" and not (caf_dir / "config.pbtxt").exists():
            # caf-serving serves the builder's files as they are (the same files as
            # onnxruntime-genai). Hard links: caf-serving refuses external data that
            # resolves outside the model directory.
            shutil.rmtree(caf_dir, ignore_errors=True)
            (caf_dir / "1").mkdir(parents=True)
            for f in genai_dir.iterdir():
                if f.is_file():
                    os.link(f, caf_dir / "1" / f.name)
            caf_config(name, caf_dir, spec)
        if llama_src:
            gguf(name, hf, out / "gguf" / f"{name}.gguf", llama_src, python)
    shutil.rmtree(out / "genai" / "cache", ignore_errors=True)
    log("models ready in", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--llama-cpp", type=pathlib.Path, default=None)
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    make(a.out, a.quick, a.llama_cpp, a.python)


if __name__ == "__main__":
    main()
