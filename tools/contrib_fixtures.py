"""Fixtures of the com.microsoft operators that onnxruntime's transformer optimizer writes
(issue 16), built with onnx.helper alone: each operator with the inputs and attributes the
optimizer uses (biases, masks of each layout, causal attention, the residual output of
SkipLayerNormalization). export_onnx_models.py's `fixtures` set calls export(); ONNX
Runtime's outputs are the references. Every input has a leading batch axis, as the server
batches requests along it.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I32 = TensorProto.FLOAT, TensorProto.INT32
MS = "com.microsoft"


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 8
    return m


def layernorms(rng):
    """SkipLayerNormalization (with bias, its residual output 3, skip broadcast from
    [S, H]) and SkipSimplifiedLayerNormalization."""
    x = rng.standard_normal((2, 4, 8), dtype=np.float32)
    skip = rng.standard_normal((2, 4, 8), dtype=np.float32)
    inits = [const("gamma", rng.standard_normal(8).astype(np.float32)),
             const("beta", rng.standard_normal(8).astype(np.float32)),
             const("bias", rng.standard_normal(8).astype(np.float32)),
             const("skip2", rng.standard_normal((4, 8)).astype(np.float32))]
    nodes = [
        helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"],
                         ["ln", "", "", "sum"], domain=MS, epsilon=1e-5),
        helper.make_node("SkipLayerNormalization", ["sum", "skip2", "gamma", "beta"], ["ln2"],
                         domain=MS, epsilon=1e-12),
        helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma", "bias"],
                         ["rms"], domain=MS, epsilon=1e-6),
        # (onnxruntime's SimplifiedLayerNormalization, T5's RMSNorm, is in the default domain,
        # which onnx.checker refuses: ops_contrib.test.cpp covers it.)
    ]
    outs = [(n, F, ["batch", 4, 8]) for n in ("ln", "sum", "ln2", "rms")]
    return model(nodes, [("x", F, ["batch", 4, 8]), ("skip", F, ["batch", 4, 8])], outs,
                 inits), {"x": x, "skip": skip}


def gelus(rng):
    """Gelu, BiasGelu, FastGelu (with and without bias), QuickGelu."""
    x = 2 * rng.standard_normal((2, 3, 8), dtype=np.float32)
    inits = [const("b", rng.standard_normal(8).astype(np.float32))]
    nodes = [
        helper.make_node("Gelu", ["x"], ["gelu"], domain=MS),
        helper.make_node("BiasGelu", ["x", "b"], ["bias_gelu"], domain=MS),
        helper.make_node("FastGelu", ["x", "b"], ["fast_gelu_b"], domain=MS),
        helper.make_node("FastGelu", ["x"], ["fast_gelu"], domain=MS),
        helper.make_node("QuickGelu", ["x"], ["quick_gelu"], alpha=1.702, domain=MS),
    ]
    outs = [(n, F, ["batch", 3, 8]) for n in ("gelu", "bias_gelu", "fast_gelu_b", "fast_gelu",
                                              "quick_gelu")]
    return model(nodes, [("x", F, ["batch", 3, 8])], outs, inits), {"x": x}


def fused_matmul(rng):
    """FusedMatMul (com.microsoft, not the engine's fusion of that name): alpha, transA,
    transB, a constant and a batched right side."""
    a = rng.standard_normal((2, 3, 5, 4), dtype=np.float32)
    inits = [const("w", rng.standard_normal((6, 5)).astype(np.float32)),
             const("wb", rng.standard_normal((3, 6, 4)).astype(np.float32))]
    nodes = [
        helper.make_node("FusedMatMul", ["a", "w"], ["at_wt"], transA=1, transB=1, alpha=0.5,
                         domain=MS),
        helper.make_node("FusedMatMul", ["a", "wb"], ["a_wbt"], transB=1, alpha=2.0, domain=MS),
    ]
    outs = [("at_wt", F, ["batch", 3, 4, 6]), ("a_wbt", F, ["batch", 3, 5, 6])]
    return model(nodes, [("a", F, ["batch", 3, 5, 4])], outs, inits), {"a": a}


def attention(rng):
    """Attention (input projection in one weight) with a [batch, sequence] mask and bias,
    and causal (unidirectional, GPT-2) with key lengths [batch] (the mask's row sums: the
    server's tensors have an axis besides the batch); 2 heads of 4."""
    x = rng.standard_normal((2, 5, 8), dtype=np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)
    inits = [const("w", (0.5 * rng.standard_normal((8, 24))).astype(np.float32)),
             const("bias", rng.standard_normal(24).astype(np.float32))]
    inits.append(const("one", np.array([1], np.int64)))
    nodes = [
        helper.make_node("Attention", ["x", "w", "bias", "mask"], ["y"], num_heads=2, domain=MS),
        helper.make_node("ReduceSum", ["mask", "one"], ["lengths"], keepdims=0),
        helper.make_node("Attention", ["x", "w", "bias", "lengths"], ["causal"], num_heads=2,
                         unidirectional=1, domain=MS),
    ]
    outs = [("y", F, ["batch", 5, 8]), ("causal", F, ["batch", 5, 8])]
    return model(nodes, [("x", F, ["batch", 5, 8]), ("mask", I32, ["batch", 5])], outs,
                 inits), {"x": x, "mask": mask}


def multi_head_attention(rng):
    """MultiHeadAttention on projected query/key/value of other lengths (cross attention),
    with bias, a [batch, kv_sequence] key padding mask and an attention bias; 2 heads."""
    q = rng.standard_normal((2, 3, 8), dtype=np.float32)
    k = rng.standard_normal((2, 4, 8), dtype=np.float32)
    v = rng.standard_normal((2, 4, 6), dtype=np.float32)
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.int32)
    inits = [const("bias", rng.standard_normal(22).astype(np.float32)),
             const("attn_bias", rng.standard_normal((1, 2, 3, 4)).astype(np.float32))]
    nodes = [helper.make_node("MultiHeadAttention", ["q", "k", "v", "bias", "mask", "attn_bias"],
                              ["y"], num_heads=2, domain=MS)]
    return model(nodes, [("q", F, ["batch", 3, 8]), ("k", F, ["batch", 4, 8]),
                         ("v", F, ["batch", 4, 6]), ("mask", I32, ["batch", 4])],
                 [("y", F, ["batch", 3, 6])], inits), {"q": q, "k": k, "v": v, "mask": mask}


def embed_layernorm(rng):
    """EmbedLayerNormalization: word + position + segment embeddings, LayerNorm, and the
    mask's lengths (mask_index) as BERT's fused embeddings write them."""
    ids = rng.integers(0, 20, (2, 6)).astype(np.int32)
    seg = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]], np.int32)
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], np.int32)
    inits = [const("word", rng.standard_normal((20, 8)).astype(np.float32)),
             const("pos", rng.standard_normal((16, 8)).astype(np.float32)),
             const("segment", rng.standard_normal((2, 8)).astype(np.float32)),
             const("gamma", rng.standard_normal(8).astype(np.float32)),
             const("beta", rng.standard_normal(8).astype(np.float32))]
    nodes = [helper.make_node("EmbedLayerNormalization",
                              ["ids", "seg", "word", "pos", "segment", "gamma", "beta", "mask"],
                              ["y", "mask_index"], epsilon=1e-12, domain=MS),
             helper.make_node("Unsqueeze", ["mask_index", "one"], ["lengths"])]
    inits.append(const("one", np.array([1], np.int64)))
    return model(nodes, [("ids", I32, ["batch", 6]), ("seg", I32, ["batch", 6]),
                         ("mask", I32, ["batch", 6])],
                 [("y", F, ["batch", 6, 8]), ("lengths", I32, ["batch", 1])], inits), \
        {"ids": ids, "seg": seg, "mask": mask}


CASES = {
    "contrib_layernorms": layernorms,
    "contrib_gelus": gelus,
    "contrib_fused_matmul": fused_matmul,
    "contrib_attention": attention,
    "contrib_multi_head_attention": multi_head_attention,
    "contrib_embed_layernorm": embed_layernorm,
}


def export(out, write_model, seed=95):
    """Writes every case with export_onnx_models.write_model (which checks the model, runs
    ONNX Runtime and writes config.pbtxt and the reference)."""
    rng = np.random.default_rng(seed)
    for name, build in CASES.items():
        m, feeds = build(rng)
        write_model(out, name, lambda p, m=m: onnx.save(m, str(p)), feeds)


def export_optimized_bert(out, write_model, bert_model, bert_wrapper, torch_export, seed=96):
    """A tiny BERT (2 layers, hidden 32, 2 heads, eager attention) exported by torch at opset
    13 and then rewritten by onnxruntime.transformers.optimizer.optimize_model at its default
    level, as users serve it: EmbedLayerNormalization (with Casts of the ids to INT32),
    Attention with the mask, SkipLayerNormalization and BiasGelu. The LayerNorm parameters
    get random values so that every fused path changes the outputs."""
    import torch
    from onnxruntime.transformers.optimizer import optimize_model
    torch.manual_seed(seed)
    model = bert_model("bert", vocab_size=128, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
    rng = np.random.default_rng(seed)
    batch, seq = 2, 8
    feeds = {"input_ids": rng.integers(0, 128, (batch, seq), dtype=np.int64),
             "attention_mask": np.ones((batch, seq), dtype=np.int64),
             "token_type_ids": np.zeros((batch, seq), dtype=np.int64)}
    feeds["attention_mask"][1, 5:] = 0  # the second row is padded
    feeds["token_type_ids"][:, seq // 2:] = 1
    names, outs = list(feeds), ["last_hidden_state", "pooler_output"]
    wrapper = bert_wrapper(model, True).eval()
    args = tuple(torch.from_numpy(feeds[n]) for n in names)

    def write(path):
        raw = path.with_name("raw.onnx")
        torch_export(wrapper, args, names, outs, raw, 13)
        opt = optimize_model(str(raw), model_type="bert", num_heads=2, hidden_size=32)
        opt.save_model_to_file(str(path))
        raw.unlink()
        used = {n.op_type for n in onnx.load(str(path)).graph.node if n.domain == MS}
        assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"} <= used, used

    write_model(out, "contrib_bert_2layer_ort_optimized", write, feeds)
