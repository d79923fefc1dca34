#!/usr/bin/env python3
"""Fixtures of onnxruntime-genai's model files (issue 34).

    tools/genai_fixtures.py ops      -> tests/onnx/fixtures/genai_ops/<case>/
    tools/genai_fixtures.py models [qwen2] -> tests/generative/fixtures/genai_<arch>_{fp32,int4}/
                                        and tests/generative/fixtures/genai_<arch>_*_reference.json

`ops`: one small model per case of the com.microsoft operators that onnxruntime-genai's model
builder writes (GroupQueryAttention, MatMulNBits, SkipSimplifiedLayerNormalization and the
default domain's SimplifiedLayerNormalization), built with onnx.helper, with random inputs and
onnxruntime's outputs as the reference: <case>/model.onnx, <case>/manifest.txt (one line per
tensor: `input|output NAME TYPE_xxx d0,d1,.. FILE`) and the raw little-endian tensors.
GroupQueryAttention's seqlens_k and total_sequence_length are computed in the graph from an
attention mask, as the builder writes them (ReduceSum(mask) - 1 and Shape(mask)[1]).

`models`: a tiny Llama (`models qwen2`: a tiny Qwen2, biases on the query, key and value
projections) with random weights (initializer_range 0.3, so that greedy tokens vary),
transformers' greedy tokens for 64 prompts of mixed lengths (computed before anything else
touches the module), then onnxruntime_genai.models.builder at fp32 and int4. The fp32 model's
references are transformers' tokens; int4 changes the numbers, so its references are
onnxruntime's greedy tokens over the int4 model (batch of one, the cache grown exactly, no
padding), checked against onnxruntime-genai's own greedy Generator on a few prompts. int4 is
built with accuracy_level=1 (fp32 activations) and asymmetric weights (uint8 zero points):
accuracy_level 4, the CPU default, quantizes activations to int8, which the engine does not.

Needs onnx, onnxruntime, onnxruntime-genai, torch, transformers; the C++ tests only read what
this writes.
"""
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parent.parent
MS = "com.microsoft"
F, I32, I64, U8 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8
TRITON = {np.float32: "TYPE_FP32", np.int32: "TYPE_INT32", np.int64: "TYPE_INT64",
          np.uint8: "TYPE_UINT8"}


# ------------------------------------------------------------------ operator cases

def make_model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(o, F, None) for o in outputs],
                          initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m


def write_case(out, name, model, feeds):
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(d / "model.onnx"))
    sess = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    outs = sess.run(names, feeds)
    lines = []
    for kind, pairs in (("input", feeds.items()), ("output", zip(names, outs))):
        for n, a in pairs:
            a = np.ascontiguousarray(a)
            f = f"{kind}_{n}.bin"
            a.tofile(d / f)
            lines.append(f"{kind} {n} {TRITON[a.dtype.type]} {','.join(map(str, a.shape))} {f}")
    (d / "manifest.txt").write_text("\n".join(lines) + "\n")
    print(name, [tuple(o.shape) for o in outs])


def mask_to_lengths(mask="mask"):
    """The builder's attn_mask_reformat: seqlens_k = ReduceSum(mask, 1) - 1 (INT32) and
    total_sequence_length = Shape(mask)[1] (INT32)."""
    return [
        helper.make_node("ReduceSum", [mask, "one_axis"], ["mask_sum"], keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one64"], ["seqlens64"]),
        helper.make_node("Cast", ["seqlens64"], ["seqlens_k"], to=I32),
        helper.make_node("Shape", [mask], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one_axis0"], ["total64"], axis=0),
        helper.make_node("Cast", ["total64"], ["total_len"], to=I32),
    ], [numpy_helper.from_array(np.array([1], np.int64), "one_axis"),
        numpy_helper.from_array(np.array(1, np.int64), "one64"),
        numpy_helper.from_array(np.array(1, np.int64), "one_axis0")]


def rotary_caches(positions, rotary_dim):
    inv = 1.0 / (10000 ** (np.arange(0, rotary_dim, 2, dtype=np.float32) / rotary_dim))
    t = np.arange(positions, dtype=np.float32)[:, None] * inv[None, :]
    return np.cos(t).astype(np.float32), np.sin(t).astype(np.float32)


def gqa_case(out, name, rng, *, B, S, P, mask_lengths, packed=True, rotary=True,
             interleaved=0, scale=None, heads=4, kv_heads=2, head=16, rotary_dim=16):
    """GroupQueryAttention with past [B, kv, P, head]; row b's mask has mask_lengths[b] ones
    (its past is mask_lengths[b] - S positions), the mask's width is P + S unless S alone
    (a first prompt)."""
    width = P + S if P > 0 else S
    mask = np.zeros((B, width), np.int64)
    for b, n in enumerate(mask_lengths):
        mask[b, :n] = 1
    nodes, inits = mask_to_lengths()
    attrs = dict(num_heads=heads, kv_num_heads=kv_heads, do_rotary=int(rotary),
                 rotary_interleaved=interleaved)
    if scale is not None:
        attrs["scale"] = scale
    feeds = {"mask": mask}
    inputs = [("mask", I64, [B, width])]
    if packed:
        feeds["qkv"] = rng.standard_normal((B, S, (heads + 2 * kv_heads) * head), np.float32)
        qkv_inputs = ["qkv", "", ""]
    else:
        feeds["q"] = rng.standard_normal((B, S, heads * head), np.float32)
        feeds["k"] = rng.standard_normal((B, S, kv_heads * head), np.float32)
        feeds["v"] = rng.standard_normal((B, S, kv_heads * head), np.float32)
        qkv_inputs = ["q", "k", "v"]
    for n in qkv_inputs:
        if n:
            inputs.append((n, F, list(feeds[n].shape)))
    feeds["past_k"] = rng.standard_normal((B, kv_heads, P, head), np.float32)
    feeds["past_v"] = rng.standard_normal((B, kv_heads, P, head), np.float32)
    inputs += [("past_k", F, [B, kv_heads, P, head]), ("past_v", F, [B, kv_heads, P, head])]
    ins = qkv_inputs + ["past_k", "past_v", "seqlens_k", "total_len"]
    if rotary:
        cos, sin = rotary_caches(64, rotary_dim)
        inits += [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")]
        ins += ["cos", "sin"]
    nodes.append(helper.make_node("GroupQueryAttention", ins, ["y", "present_k", "present_v"],
                                  domain=MS, **attrs))
    write_case(out, name, make_model(nodes, inputs, ["y", "present_k", "present_v"], inits),
               feeds)


def matmul_nbits_case(out, name, rng, *, K, N, block, zero_points=None, bias=False, rows=(2, 3)):
    """MatMulNBits (4 bits) of A [rows.., K] with random packed weights and scales;
    zero_points None, "uint8" (packed nibbles) or "float" (one per block, as scales)."""
    blocks = (K + block - 1) // block
    w = rng.integers(0, 256, (N, blocks, block // 2), dtype=np.uint8)
    scales = (rng.random((N * blocks,), np.float32) * 0.2 + 0.01).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scales, "scales")]
    ins = ["a", "w", "scales"]
    if zero_points == "uint8":
        zp = rng.integers(0, 256, (N * ((blocks + 1) // 2),), dtype=np.uint8)
        inits.append(numpy_helper.from_array(zp, "zp"))
        ins.append("zp")
    elif zero_points == "float":
        zp = (rng.random((N * blocks,), np.float32) * 15).astype(np.float32)
        inits.append(numpy_helper.from_array(zp, "zp"))
        ins.append("zp")
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(N, np.float32), "bias"))
        ins += [""] * (4 - len(ins)) + ["", "bias"]
    a = rng.standard_normal((*rows, K), np.float32)
    node = helper.make_node("MatMulNBits", ins, ["y"], domain=MS, K=K, N=N, bits=4,
                            block_size=block, accuracy_level=0)
    write_case(out, name, make_model([node], [("a", F, list(a.shape))], ["y"], inits), {"a": a})


def norms_case(out, rng):
    """SkipSimplifiedLayerNormalization with all four outputs (and with a bias), then the
    default domain's SimplifiedLayerNormalization, as the builder chains them."""
    x = rng.standard_normal((2, 3, 16), np.float32)
    skip = rng.standard_normal((2, 3, 16), np.float32)
    inits = [numpy_helper.from_array(rng.standard_normal(16, np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(16, np.float32), "bias")]
    nodes = [
        helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"],
                         ["y", "mean", "inv_std", "sum"], domain=MS, epsilon=1e-6),
        helper.make_node("SkipSimplifiedLayerNormalization", ["sum", "x", "gamma", "bias"],
                         ["y2", "", "", "sum2"], domain=MS, epsilon=1e-5),
        helper.make_node("SimplifiedLayerNormalization", ["sum2", "gamma"], ["y3"],
                         epsilon=1e-6, axis=-1, stash_type=1),
    ]
    write_case(out, "simplified_layernorms",
               make_model(nodes, [("x", F, [2, 3, 16]), ("skip", F, [2, 3, 16])],
                          ["y", "inv_std", "sum", "y2", "sum2", "y3"], inits),
               {"x": x, "skip": skip})


def ops(out):
    rng = np.random.default_rng(34)
    if out.exists():
        shutil.rmtree(out)
    # Token generation: three rows of different past lengths in one past buffer of 6.
    gqa_case(out, "gqa_decode", rng, B=3, S=1, P=6, mask_lengths=[7, 3, 1])
    # A first prompt (sequence length = total). (Not right-padded: onnxruntime's outputs at
    # a padded row's padding come from scores it leaves uninitialized.)
    gqa_case(out, "gqa_first_prompt", rng, B=2, S=5, P=0, mask_lengths=[5, 5])
    # A prompt chunk after 4 cached positions (past buffer 6, padded).
    gqa_case(out, "gqa_chunk", rng, B=1, S=3, P=6, mask_lengths=[7])
    gqa_case(out, "gqa_interleaved", rng, B=2, S=1, P=4, mask_lengths=[5, 2], interleaved=1)
    gqa_case(out, "gqa_separate_no_rotary", rng, B=2, S=1, P=4, mask_lengths=[3, 5],
             packed=False, rotary=False, scale=0.1)
    gqa_case(out, "gqa_partial_rotary", rng, B=2, S=2, P=0, mask_lengths=[2, 2], heads=2,
             kv_heads=1, head=32, rotary_dim=16)
    matmul_nbits_case(out, "matmul_nbits", rng, K=64, N=24, block=32)
    matmul_nbits_case(out, "matmul_nbits_zp_bias", rng, K=48, N=20, block=32,
                      zero_points="uint8", bias=True)
    matmul_nbits_case(out, "matmul_nbits_float_zp", rng, K=80, N=8, block=16,
                      zero_points="float", rows=(5,))
    norms_case(out, rng)


# ------------------------------------------------------------------ models

VOCAB = 512
CONTEXT = 256
EOS_ID = 0


def corpus_lines():
    lines = []
    for pattern in ("*.md", "docs/*.md"):
        for path in sorted(ROOT.glob(pattern)):
            lines += [l for l in path.read_text(encoding="utf-8").splitlines()
                      if len(l.split()) >= 3]
    return lines


def prompts(tok):
    """64 prompts of 1..47 tokens from the repository's prose, max_tokens 1..32 each."""
    rng = np.random.RandomState(34)
    lines = corpus_lines()
    out = []
    for _ in range(64):
        ids = tok.encode(lines[rng.randint(len(lines))]).ids[: int(rng.randint(1, 48))]
        out.append((ids, int(rng.randint(1, 33))))
    return out


def hf_references(model, cases):
    """Greedy generate with no end-of-sequence token, so that every case runs its
    max_tokens with nothing changing the logits (min_new_tokens would mask the EOS logit,
    which the served model does not: the argmax there would be EOS)."""
    import torch
    model.generation_config.eos_token_id = None
    refs = []
    for ids, max_tokens in cases:
        with torch.no_grad():
            o = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                               dtype=torch.int64), max_new_tokens=max_tokens,
                               do_sample=False, output_scores=True,
                               return_dict_in_generate=True, pad_token_id=EOS_ID)
        assert o.sequences.shape[1] == len(ids) + max_tokens
        gaps = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in o.scores]
        refs.append({"prompt_ids": ids, "max_tokens": max_tokens,
                     "generated_ids": o.sequences[0, len(ids):].tolist(), "top2_gaps": gaps})
    return refs


def ort_references(model_file, cases, layers, kv_heads, head):
    """Greedy over onnxruntime: the prompt in one run (empty past), then a token a run."""
    sess = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    refs = []
    for ids, max_tokens in cases:
        past = {f"past_key_values.{l}.{kv}": np.zeros((1, kv_heads, 0, head), np.float32)
                for l in range(layers) for kv in ("key", "value")}
        tokens, generated, gaps = list(ids), [], []
        step = list(ids)
        for _ in range(max_tokens):
            feeds = {"input_ids": np.array([step], np.int64),
                     "attention_mask": np.ones((1, len(tokens)), np.int64), **past}
            outs = sess.run(None, feeds)
            names = [o.name for o in sess.get_outputs()]
            got = dict(zip(names, outs))
            logits = got["logits"][0, -1]
            top = np.sort(logits)[-2:]
            gaps.append(float(top[1] - top[0]))
            nxt = int(np.argmax(logits))
            generated.append(nxt)
            tokens.append(nxt)
            step = [nxt]
            past = {k: got[k.replace("past_key_values", "present")] for k in past}
        refs.append({"prompt_ids": ids, "max_tokens": max_tokens, "generated_ids": generated,
                     "top2_gaps": gaps})
    return refs


def genai_greedy(model_dir, ids, max_tokens):
    import onnxruntime_genai as og
    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + max_tokens,
                              min_length=len(ids) + max_tokens)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    while not gen.is_done():
        gen.generate_next_token()
    return list(gen.get_sequence(0))[len(ids):]


def add_texts(tok, refs):
    """Each case's prompt text and the text its tokens show after the prompt's
    (decode(prompt + generated) less decode(prompt)), for the server tests."""
    for r in refs:
        prompt = tok.decode(r["prompt_ids"])
        whole = tok.decode(r["prompt_ids"] + r["generated_ids"])
        r["prompt"] = prompt
        r["generated_text"] = whole[len(prompt):] if whole.startswith(prompt) else None


def models(out, arch="llama"):
    import torch
    from tokenizers import Tokenizer
    from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast,
                              Qwen2Config, Qwen2ForCausalLM)

    tok_file = ROOT / "tests/generative/fixtures/tiny_gpt2/1/tokenizer.json"
    tok = Tokenizer.from_file(str(tok_file))
    torch.manual_seed(0)
    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM),
                                 "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    cfg = config_class(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=CONTEXT, initializer_range=0.3,
                       bos_token_id=EOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=False)
    model = model_class(cfg).eval()
    if arch == "qwen2":
        # Qwen2's projection biases start at zero: random ones, so that they count.
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                             layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.3)
    cases = prompts(tok)
    print("transformers' greedy references for 64 prompts", flush=True)
    fp32_refs = hf_references(model, cases)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        model.save_pretrained(tmp / "hf")
        PreTrainedTokenizerFast(tokenizer_file=str(tok_file), eos_token="<|endoftext|>",
                                bos_token="<|endoftext|>").save_pretrained(tmp / "hf")
        for precision, extra in (("fp32", []), ("int4", ["--extra_options", "accuracy_level=1",
                                                         "is_symmetric=false"])):
            dst = out / f"genai_{arch}_{precision}"
            if dst.exists():
                shutil.rmtree(dst)
            subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder",
                            "-i", str(tmp / "hf"), "-o", str(tmp / precision), "-p", precision,
                            "-e", "cpu", "-c", str(tmp / "cache")] + extra, check=True)
            version = dst / "1"
            version.mkdir(parents=True)
            for f in (tmp / precision).iterdir():
                shutil.copy(f, version / f.name)
            (dst / "config.pbtxt").write_text(
                f'name: "genai_{arch}_{precision}"\nbackend: "onnxruntime"\n'
                "model_transaction_policy { decoupled: true }\n")
    int4_dir = out / f"genai_{arch}_int4" / "1"
    print("onnxruntime's greedy references of the int4 model", flush=True)
    int4_refs = ort_references(int4_dir / "model.onnx", cases, 2, 2, 16)
    for i in (0, 17, 42, 63):
        og_tokens = genai_greedy(int4_dir, cases[i][0], cases[i][1])
        assert og_tokens == int4_refs[i]["generated_ids"], (i, og_tokens, int4_refs[i])
    fp32_ort = ort_references(out / f"genai_{arch}_fp32" / "1" / "model.onnx", cases, 2, 2, 16)
    same = sum(a["generated_ids"] == b["generated_ids"] for a, b in zip(fp32_ort, fp32_refs))
    print(f"fp32 model over onnxruntime matches transformers on {same}/64 prompts")
    for refs in (fp32_refs, int4_refs):
        add_texts(tok, refs)
    for precision, refs, source in (("fp32", fp32_refs, "transformers generate (greedy)"),
                                    ("int4", int4_refs, "onnxruntime greedy over the int4 "
                                     "model, equal to onnxruntime-genai's Generator")):
        (out / f"genai_{arch}_{precision}_reference.json").write_text(json.dumps(
            {"model": f"genai_{arch}_{precision}", "eos_id": EOS_ID, "source": source,
             "cases": refs}) + "\n")
    print("wrote", out)


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "ops":
        ops(pathlib.Path(sys.argv[2]) if len(sys.argv) > 2
            else ROOT / "tests/onnx/fixtures/genai_ops")
    elif what == "models":
        arch = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] in ("llama", "qwen2") else "llama"
        rest = [a for a in sys.argv[2:] if a not in ("llama", "qwen2")]
        models(pathlib.Path(rest[0]) if rest else ROOT / "tests/generative/fixtures", arch)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
