#!/usr/bin/env python3
"""Fixtures with variable dimensions besides the batch, built with onnx.helper alone
(no torch), with ONNX Runtime's outputs at several input sizes as references.

    python3 tools/onnx_dynamic_fixtures.py [OUT]   # default tests/onnx/fixtures

tools/export_onnx_models.py's `fixtures` set calls write() too. Layout as there:
models/<name>/{config.pbtxt,1/model.onnx}; reference/<name>/ at the first size, and
reference/<name>@<tag>/ at each further size (onnx.server.test runs every one).

  dyn_bert_block_opset17: a BERT-like block over a symbolic "seq" axis: token and
    position embeddings (Shape -> Gather -> Range -> Gather), LayerNormalization,
    two-head attention with the padding mask, output projection, residual and
    LayerNormalization; outputs the hidden states [batch, seq, 16] and the first
    token's [batch, 16]. config.pbtxt gives dims -1 and lists one expected shape.
  dyn_cnn_opset17: Conv -> Relu -> MaxPool -> strided Conv -> Relu over symbolic
    H and W, then GlobalAveragePool -> Flatten -> Gemm; outputs the feature map
    [batch, 8, H/4, W/4] and the logits [batch, 5]. config.pbtxt lists no inputs or
    outputs: the server derives them, -1 where they vary.
"""
import pathlib
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

TRITON_TYPE = {"float32": "TYPE_FP32", "int64": "TYPE_INT64"}
N = helper.make_node
F = TensorProto.FLOAT


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def save(model, out, name, config):
    model_dir = out / "models" / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir / "1" / "model.onnx"


def write_references(out, name, onnx_file, cases):
    """cases: [(tag or None, feeds)]; ONNX Runtime's outputs for each."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_file), opts, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    for tag, feeds in cases:
        outs = sess.run(None, feeds)
        ref_dir = out / "reference" / (name if tag is None else f"{name}@{tag}")
        ref_dir.mkdir(parents=True, exist_ok=True)
        manifest = []
        for kind, pairs in (("input", list(feeds.items())), ("output", list(zip(out_names, outs)))):
            for n, a in pairs:
                a = np.ascontiguousarray(a)
                fname = f"{kind}_{n}.bin"
                a.tofile(ref_dir / fname)
                manifest.append(f"{kind} {n} {TRITON_TYPE[a.dtype.name]} "
                                f"{','.join(str(d) for d in a.shape)} {fname}")
        (ref_dir / "manifest.txt").write_text("\n".join(manifest) + "\n")
        print(f"{name}@{tag}: outputs {[tuple(o.shape) for o in outs]}")


def bert_block(out, seed):
    rng = np.random.default_rng(seed)
    H, heads, D, vocab, positions = 16, 2, 8, 64, 64

    def w(name, *shape, scale=1.0):
        return const(name, rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))

    nodes = [
        N("Gather", ["word_emb", "input_ids"], ["tok"]),
        N("Shape", ["input_ids"], ["ids_shape"]),
        N("Gather", ["ids_shape", "one"], ["seq_len"], axis=0),
        N("Range", ["zero", "seq_len", "one"], ["pos_ids"]),
        N("Gather", ["pos_emb", "pos_ids"], ["pos"]),
        N("Add", ["tok", "pos"], ["emb"]),
        N("LayerNormalization", ["emb", "ln0.g", "ln0.b"], ["x"], axis=-1, epsilon=1e-12),
    ]
    for p in "qkv":
        nodes += [N("MatMul", ["x", f"w{p}"], [f"{p}_mm"]),
                  N("Add", [f"{p}_mm", f"b{p}"], [f"{p}_flat"]),
                  N("Reshape", [f"{p}_flat", "split_heads"], [f"{p}_4d"])]
    nodes += [
        N("Transpose", ["q_4d"], ["q"], perm=[0, 2, 1, 3]),
        N("Transpose", ["k_4d"], ["kt"], perm=[0, 2, 3, 1]),
        N("Transpose", ["v_4d"], ["v"], perm=[0, 2, 1, 3]),
        N("MatMul", ["q", "kt"], ["scores_raw"]),
        N("Div", ["scores_raw", "sqrt_d"], ["scores"]),
        N("Cast", ["attention_mask"], ["mask_f"], to=F),
        N("Sub", ["onef", "mask_f"], ["inv_mask"]),
        N("Mul", ["inv_mask", "neg_big"], ["mask_add"]),
        N("Unsqueeze", ["mask_add", "axes12"], ["mask4"]),
        N("Add", ["scores", "mask4"], ["masked"]),
        N("Softmax", ["masked"], ["probs"], axis=-1),
        N("MatMul", ["probs", "v"], ["ctx4"]),
        N("Transpose", ["ctx4"], ["ctx_t"], perm=[0, 2, 1, 3]),
        N("Reshape", ["ctx_t", "merge_heads"], ["ctx"]),
        N("MatMul", ["ctx", "wo"], ["o_mm"]),
        N("Add", ["o_mm", "bo"], ["o"]),
        N("Add", ["o", "x"], ["res"]),
        N("LayerNormalization", ["res", "ln1.g", "ln1.b"], ["hidden"], axis=-1, epsilon=1e-12),
        N("Gather", ["hidden", "zero"], ["first_token"], axis=1),
    ]
    inits = [w("word_emb", vocab, H), w("pos_emb", positions, H, scale=0.5),
             const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64)),
             w("ln0.g", H, scale=0.2), w("ln0.b", H, scale=0.1),
             w("ln1.g", H, scale=0.2), w("ln1.b", H, scale=0.1),
             const("split_heads", np.array([0, 0, heads, D], np.int64)),
             const("merge_heads", np.array([0, 0, H], np.int64)),
             const("sqrt_d", np.array(np.sqrt(D), np.float32)),
             const("onef", np.array(1.0, np.float32)),
             const("neg_big", np.array(-10000.0, np.float32)),
             const("axes12", np.array([1, 2], np.int64)),
             w("wo", H, H, scale=0.25), w("bo", H, scale=0.1)]
    for p in "qkv":
        inits += [w(f"w{p}", H, H, scale=0.25), w(f"b{p}", H, scale=0.1)]
    g = helper.make_graph(
        nodes, "dyn_bert_block",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("hidden", F, ["batch", "seq", H]),
         helper.make_tensor_value_info("first_token", F, ["batch", H])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    name = "dyn_bert_block_opset17"
    config = f'''name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [
  {{ name: "hidden" data_type: TYPE_FP32 dims: [ -1, {H} ] }},
  {{ name: "first_token" data_type: TYPE_FP32 dims: [ {H} ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 200 }}
parameters {{ key: "expected_shapes" value: {{ string_value: "input_ids:7;attention_mask:7" }} }}
'''
    path = save(m, out, name, config)

    def feeds(batch, seq):
        ids = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
        mask = np.ones((batch, seq), dtype=np.int64)
        for b in range(1, batch):  # padding at the end of all but the first row
            mask[b, seq - (b * 2) % seq:] = 0
        return {"input_ids": ids, "attention_mask": mask}

    write_references(out, name, path, [(None, feeds(2, 7)), ("seq3", feeds(3, 3)),
                                       ("seq12", feeds(2, 12)), ("seq1", feeds(2, 1)),
                                       ("seq40", feeds(4, 40))])


def cnn(out, seed):
    rng = np.random.default_rng(seed)

    def w(name, *shape, scale=1.0):
        return const(name, rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))

    nodes = [
        N("Conv", ["x", "c1.w", "c1.b"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        N("Relu", ["c1"], ["r1"]),
        N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        N("Conv", ["p1", "c2.w", "c2.b"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
          strides=[2, 2]),
        N("Relu", ["c2"], ["features"]),
        N("GlobalAveragePool", ["features"], ["gap"]),
        N("Flatten", ["gap"], ["flat"], axis=1),
        N("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1),
    ]
    inits = [w("c1.w", 8, 3, 3, 3, scale=0.3), w("c1.b", 8, scale=0.1),
             w("c2.w", 8, 8, 3, 3, scale=0.15), w("c2.b", 8, scale=0.1),
             w("fc.w", 5, 8, scale=0.5), w("fc.b", 5, scale=0.1)]
    g = helper.make_graph(
        nodes, "dyn_cnn",
        [helper.make_tensor_value_info("x", F, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("features", F, ["batch", 8, "fh", "fw"]),
         helper.make_tensor_value_info("logits", F, ["batch", 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    name = "dyn_cnn_opset17"
    config = f'''name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
dynamic_batching {{ max_queue_delay_microseconds: 200 }}
'''
    path = save(m, out, name, config)

    def feeds(batch, h, wd):
        return {"x": rng.standard_normal((batch, 3, h, wd), dtype=np.float32)}

    write_references(out, name, path, [(None, feeds(2, 16, 16)), ("12x20", feeds(3, 12, 20)),
                                       ("9x7", feeds(2, 9, 7)), ("32x8", feeds(2, 32, 8))])


def write(out):
    bert_block(out, 90)
    cnn(out, 91)


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parent.parent
    write(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "tests" / "onnx" / "fixtures")
