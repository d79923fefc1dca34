"""Fixtures at opsets 18 and newer (issue 16), built with onnx.helper alone: the
operators whose meaning changed after opset 17 (ReduceMean's axes input,
Split's num_outputs, the pools' ceil_mode and dilations, Relu on integers,
CastLike, Pow with an integer exponent) and a small CNN and transformer block
as an exporter writes them at opset 21. export_onnx_models.py's `fixtures` set
calls export(); ONNX Runtime's outputs are the references.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def model(nodes, inputs, outputs, inits, opset):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def reduce_axes_opset18(rng):
    """ReduceMean-18: axes as an input (negative, several), noop_with_empty_axes."""
    x = rng.standard_normal((2, 3, 4), dtype=np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["x", "last"], ["mean_last"]),
        helper.make_node("ReduceMean", ["x", "both"], ["mean_both"]),
        helper.make_node("ReduceMean", ["x"], ["same"], noop_with_empty_axes=1),
        helper.make_node("ReduceSum", ["x", "mid"], ["sum_mid"], keepdims=0),
    ]
    inits = [const("last", np.array([-1], np.int64)), const("both", np.array([1, 2], np.int64)),
             const("mid", np.array([1], np.int64))]
    outs = [("mean_last", F, ["batch", 3, 1]), ("mean_both", F, ["batch", 1, 1]),
            ("same", F, ["batch", 3, 4]), ("sum_mid", F, ["batch", 4])]
    return model(nodes, [("x", F, ["batch", 3, 4])], outs, inits, 18), {"x": x}


def split_num_outputs_opset18(rng):
    """Split-18's num_outputs, with a smaller last part (7 = 3 + 3 + 1)."""
    x = rng.standard_normal((2, 7), dtype=np.float32)
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)]
    outs = [("a", F, ["batch", 3]), ("b", F, ["batch", 3]), ("c", F, ["batch", 1])]
    return model(nodes, [("x", F, ["batch", 7])], outs, [], 18), {"x": x}


def pools_opset19(rng):
    """MaxPool and AveragePool-19 with dilations and ceil_mode, where the last
    window would start in the right padding (and is dropped)."""
    x = rng.standard_normal((2, 2, 7, 7), dtype=np.float32)
    nodes = [
        helper.make_node("MaxPool", ["x"], ["max"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], dilations=[2, 2], ceil_mode=1),
        helper.make_node("AveragePool", ["x"], ["avg"], kernel_shape=[2, 2], strides=[2, 2],
                         pads=[1, 1, 1, 1], dilations=[2, 1], ceil_mode=1),
        helper.make_node("AveragePool", ["x"], ["avg_pad"], kernel_shape=[3, 3], strides=[3, 3],
                         pads=[0, 0, 1, 1], ceil_mode=1, count_include_pad=1),
    ]
    outs = [("max", F, ["batch", 2, 3, 3]), ("avg", F, ["batch", 2, 4, 4]),
            ("avg_pad", F, ["batch", 2, 3, 3])]
    return model(nodes, [("x", F, ["batch", 2, 7, 7])], outs, [], 19), {"x": x}


def integers_opset22(rng):
    """Relu-14 on INT32 (ONNX Runtime has no INT64 Relu), CastLike-15, Pow with
    an INT64 exponent (Pow-12/15), Clip-13 and ReduceSum-13 on INT32."""
    x = (4 * rng.standard_normal((2, 6))).astype(np.float32)
    nodes = [
        helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT32),
        helper.make_node("Relu", ["xi"], ["ri"]),
        helper.make_node("CastLike", ["ri", "x"], ["rf"]),
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("Add", ["rf", "sq"], ["y"]),
        helper.make_node("Clip", ["xi", "lo", "hi"], ["clipped"]),
        helper.make_node("ReduceSum", ["xi", "last"], ["total"]),
    ]
    inits = [const("two", np.array(2, np.int64)), const("lo", np.array(-2, np.int32)),
             const("hi", np.array(3, np.int32)), const("last", np.array([1], np.int64))]
    outs = [("y", F, ["batch", 6]), ("ri", TensorProto.INT32, ["batch", 6]),
            ("clipped", TensorProto.INT32, ["batch", 6]), ("total", TensorProto.INT32, ["batch", 1])]
    return model(nodes, [("x", F, ["batch", 6])], outs, inits, 22), {"x": x}


def layernorm_stats_opset21(rng):
    """LayerNormalization's optional Mean and InvStdDev outputs, over two axes
    and, with Mean omitted, over the last."""
    x = rng.standard_normal((2, 3, 4), dtype=np.float32)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g2", "b2"], ["y", "mean", "inv"], axis=1,
                         epsilon=1e-3),
        helper.make_node("LayerNormalization", ["x", "g1"], ["y_last", "", "inv_last"], axis=-1),
    ]
    inits = [const("g2", 1 + rng.standard_normal((3, 4), dtype=np.float32) * 0.1),
             const("b2", rng.standard_normal((3, 4), dtype=np.float32) * 0.1),
             const("g1", 1 + rng.standard_normal(4, dtype=np.float32) * 0.1)]
    outs = [("y", F, ["batch", 3, 4]), ("mean", F, ["batch", 1, 1]), ("inv", F, ["batch", 1, 1]),
            ("y_last", F, ["batch", 3, 4]), ("inv_last", F, ["batch", 3, 1])]
    return model(nodes, [("x", F, ["batch", 3, 4])], outs, inits, 21), {"x": x}


def layernorm_pattern_opset18(rng):
    """LayerNorm written out with ReduceMean-18 (axes as an input), as an
    exporter decomposes it at opset 18: the fusion must still find it."""
    x = rng.standard_normal((2, 5, 16), dtype=np.float32)
    n = helper.make_node
    nodes = [
        n("ReduceMean", ["x", "last"], ["mean"]), n("Sub", ["x", "mean"], ["d"]),
        n("Pow", ["d", "two"], ["sq"]), n("ReduceMean", ["sq", "last"], ["var"]),
        n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["std"]), n("Div", ["d", "std"], ["nrm"]),
        n("Mul", ["nrm", "gamma"], ["scaled"]), n("Add", ["scaled", "beta"], ["y"]),
    ]
    inits = [const("last", np.array([-1], np.int64)), const("two", np.float32(2)),
             const("eps", np.float32(1e-5)),
             const("gamma", 1 + 0.1 * rng.standard_normal(16, dtype=np.float32)),
             const("beta", 0.1 * rng.standard_normal(16, dtype=np.float32))]
    return model(nodes, [("x", F, ["batch", 5, 16])], [("y", F, ["batch", 5, 16])], inits, 18), {"x": x}


def auto_pad_opset22(rng):
    """auto_pad SAME_UPPER and SAME_LOWER (odd total padding) and VALID on
    Conv-22, MaxPool-22 and AveragePool-22."""
    x = rng.standard_normal((2, 3, 8, 7), dtype=np.float32)
    w = (rng.standard_normal((4, 3, 3, 2)) * 0.3).astype(np.float32)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w"], ["conv_upper"], auto_pad="SAME_UPPER", strides=[2, 2]),
        n("Conv", ["x", "w"], ["conv_lower"], auto_pad="SAME_LOWER", strides=[1, 2]),
        n("MaxPool", ["x"], ["max_lower"], kernel_shape=[2, 3], auto_pad="SAME_LOWER", strides=[3, 2]),
        n("AveragePool", ["x"], ["avg_upper"], kernel_shape=[3, 2], auto_pad="SAME_UPPER"),
        n("AveragePool", ["x"], ["avg_valid"], kernel_shape=[3, 3], auto_pad="VALID", strides=[2, 2]),
    ]
    outs = [("conv_upper", F, ["batch", 4, 4, 4]), ("conv_lower", F, ["batch", 4, 8, 4]),
            ("max_lower", F, ["batch", 3, 3, 4]), ("avg_upper", F, ["batch", 3, 8, 7]),
            ("avg_valid", F, ["batch", 3, 3, 3])]
    return model(nodes, [("x", F, ["batch", 3, 8, 7])], outs, [const("w", w)], 22), {"x": x}


def cnn_opset21(rng):
    """A small CNN as exporters write it at opset 21: Conv, BatchNormalization,
    Relu, MaxPool (ceil_mode), a residual Add, GlobalAveragePool, Flatten, Gemm."""
    x = rng.standard_normal((2, 3, 12, 12), dtype=np.float32)
    def w(*s):
        return (rng.standard_normal(s) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c1", "s", "o", "m", "v"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "p1"], ["res"]),
        helper.make_node("Relu", ["res"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc", "fcb"], ["logits"], transB=1),
    ]
    inits = [const("w1", w(8, 3, 3, 3)), const("b1", w(8)), const("s", 1 + w(8)), const("o", w(8)),
             const("m", w(8)), const("v", np.abs(w(8)) + 0.5), const("w2", w(8, 8, 3, 3)),
             const("fc", w(5, 8)), const("fcb", w(5))]
    return (model(nodes, [("x", F, ["batch", 3, 12, 12])], [("logits", F, ["batch", 5])], inits, 21),
            {"x": x})


def transformer_opset21(rng):
    """One pre-norm transformer encoder block at opset 21: LayerNormalization,
    Q/K/V MatMuls, heads by Reshape/Transpose, scaled scores, Softmax with an
    additive mask, output projection, residuals, an erf-GELU MLP; the head
    split takes its sizes from Shape(start, end) (Shape-15)."""
    S, D, H = 5, 16, 2
    x = rng.standard_normal((2, S, D), dtype=np.float32)
    mask = np.zeros((2, 1, 1, S), np.float32)
    mask[1, ..., S - 2:] = -1e4
    def w(*s):
        return (rng.standard_normal(s) * 0.25).astype(np.float32)
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "g1", "be1"], ["ln1"], axis=-1, epsilon=1e-5),
        n("Shape", ["x"], ["bs"], start=0, end=2),
        n("Concat", ["bs", "heads"], ["hshape"], axis=0),
    ]
    for p in "qkv":
        nodes += [n("MatMul", ["ln1", "w" + p], [p + "0"]), n("Add", [p + "0", "b" + p], [p + "1"]),
                  n("Reshape", [p + "1", "hshape"], [p + "2"]),
                  n("Transpose", [p + "2"], [p], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3])]
    nodes += [
        n("MatMul", ["q", "k"], ["sc0"]), n("Mul", ["sc0", "scale"], ["sc1"]),
        n("Add", ["sc1", "mask"], ["sc2"]), n("Softmax", ["sc2"], ["att"], axis=-1),
        n("MatMul", ["att", "v"], ["ctx0"]), n("Transpose", ["ctx0"], ["ctx1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx1", "flat"], ["ctx"]),
        n("MatMul", ["ctx", "wo"], ["o0"]), n("Add", ["o0", "bo"], ["o1"]),
        n("Add", ["x", "o1"], ["h"]),
        n("LayerNormalization", ["h", "g2", "be2"], ["ln2"], axis=-1, epsilon=1e-5),
        n("MatMul", ["ln2", "w1"], ["f0"]), n("Add", ["f0", "b1"], ["f1"]),
        n("Div", ["f1", "sqrt2"], ["f2"]), n("Erf", ["f2"], ["f3"]), n("Add", ["f3", "one"], ["f4"]),
        n("Mul", ["f1", "f4"], ["f5"]), n("Mul", ["f5", "half"], ["f6"]),
        n("MatMul", ["f6", "w2"], ["f7"]), n("Add", ["f7", "b2"], ["f8"]),
        n("Add", ["h", "f8"], ["y"]),
    ]
    inits = [const("g1", 1 + w(D)), const("be1", w(D)), const("g2", 1 + w(D)), const("be2", w(D)),
             const("heads", np.array([H, D // H], np.int64)),
             const("flat", np.array([0, 0, D], np.int64)),
             const("scale", np.float32(1 / np.sqrt(D // H))),
             const("wo", w(D, D)), const("bo", w(D)), const("w1", w(D, 2 * D)), const("b1", w(2 * D)),
             const("w2", w(2 * D, D)), const("b2", w(D)), const("sqrt2", np.float32(np.sqrt(2))),
             const("one", np.float32(1)), const("half", np.float32(0.5))]
    for p in "qkv":
        inits += [const("w" + p, w(D, D)), const("b" + p, w(D))]
    ins = [("x", F, ["batch", S, D]), ("mask", F, ["batch", 1, 1, S])]
    return model(nodes, ins, [("y", F, ["batch", S, D])], inits, 21), {"x": x, "mask": mask}


CASES = {
    "opset18_reduce_axes": reduce_axes_opset18,
    "opset18_split_num_outputs": split_num_outputs_opset18,
    "opset19_pools": pools_opset19,
    "opset22_integers": integers_opset22,
    "opset21_cnn": cnn_opset21,
    "opset21_transformer": transformer_opset21,
    "opset21_layernorm_stats": layernorm_stats_opset21,
    "pattern_layernorm_opset18": layernorm_pattern_opset18,
    "opset22_auto_pad": auto_pad_opset22,
}


def export(out, write_model, seed=90):
    """Writes every case with export_onnx_models.write_model (which checks the
    model, runs ONNX Runtime and writes config.pbtxt and the reference)."""
    rng = np.random.default_rng(seed)
    for name, build in CASES.items():
        m, feeds = build(rng)
        write_model(out, name, lambda p, m=m: onnx.save(m, str(p)), feeds)
