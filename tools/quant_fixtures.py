"""INT8 fixtures (issue 16): one graph per integer operator, built with
onnx.helper (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv,
DynamicQuantizeLinear; per tensor and per output channel), and a tiny MLP and
CNN quantized by onnxruntime.quantization: quantize_dynamic (MatMulInteger +
DynamicQuantizeLinear), quantize_static in QOperator format (QLinearConv,
QLinearMatMul) and in QDQ format (QuantizeLinear/DequantizeLinear around Conv
and MatMul), and a miniature ResNet quantized in QDQ format as run_bench.py
quantizes ResNet-50. export_onnx_models.py's `fixtures` set calls export(); ONNX
Runtime's outputs are the references.

DynamicQuantizeLinear quantizes with the range of the whole tensor, batch
included: its fixtures are written at batch 1, so that the server test's
first-row check is the same computation.
"""
import pathlib
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, U8, I8, I32 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def model(nodes, inputs, outputs, inits, opset=13):
    """The engine loads opsets 13 and newer; the operators keep their versions 10 and 11."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def u8(rng, shape):
    return rng.integers(0, 256, shape, dtype=np.uint8)


def i8(rng, shape):
    return rng.integers(-128, 128, shape, dtype=np.int8)


def matmul_integer(rng):
    """MatMulInteger: UINT8 A [batch, 2, 4] with a zero point by INT8 B with one
    zero point per column; and without zero points, UINT8 by UINT8."""
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"]),
             helper.make_node("MatMulInteger", ["a", "b2"], ["y2"])]
    inits = [const("b", i8(rng, (4, 3))), const("az", np.uint8(131)),
             const("bz", np.array([3, -7, 0], np.int8)), const("b2", u8(rng, (4, 5)))]
    outs = [("y", I32, ["batch", 2, 3]), ("y2", I32, ["batch", 2, 5])]
    return model(nodes, [("a", U8, ["batch", 2, 4])], outs, inits), {"a": u8(rng, (2, 2, 4))}


def conv_integer(rng):
    """ConvInteger: UINT8 input and weights with zero points, padding and stride 2."""
    nodes = [helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1],
                              strides=[2, 2]),
             helper.make_node("ConvInteger", ["x", "w"], ["y0"], kernel_shape=[3, 3])]
    inits = [const("w", u8(rng, (4, 2, 3, 3))), const("xz", np.uint8(100)),
             const("wz", np.uint8(120))]
    outs = [("y", I32, ["batch", 4, 3, 3]), ("y0", I32, ["batch", 4, 3, 3])]
    return (model(nodes, [("x", U8, ["batch", 2, 5, 5])], outs, inits),
            {"x": u8(rng, (2, 2, 5, 5))})


def qlinear_matmul(rng, opset):
    """QLinearMatMul: UINT8 A by INT8 B with a scale per column, UINT8 output;
    and INT8 A by INT8 B per tensor with an INT8 output."""
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                              ["y"]),
             helper.make_node("QLinearMatMul", ["a8", "as", "az8", "b", "bs1", "bz1", "ys",
                                                "yz8"], ["y8"])]
    inits = [const("as", np.float32(0.02)), const("az", np.uint8(128)),
             const("b", i8(rng, (6, 5))),
             const("bs", np.array([0.01, 0.02, 0.005, 0.03, 0.015], np.float32)),
             const("bz", np.zeros(5, np.int8)), const("ys", np.float32(0.05)),
             const("yz", np.uint8(120)), const("az8", np.int8(-3)), const("bs1", np.float32(0.01)),
             const("bz1", np.int8(2)), const("yz8", np.int8(5))]
    outs = [("y", U8, ["batch", 3, 5]), ("y8", I8, ["batch", 3, 5])]
    feeds = {"a": u8(rng, (2, 3, 6)), "a8": i8(rng, (2, 3, 6))}
    return model(nodes, [("a", U8, ["batch", 3, 6]), ("a8", I8, ["batch", 3, 6])], outs, inits,
                 opset), feeds


def qlinear_conv(rng):
    """QLinearConv: UINT8 input, INT8 weights with a scale per output channel,
    INT32 bias, padding; and a grouped INT8 convolution per tensor, no bias."""
    nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                              ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("QLinearConv", ["x8", "xs", "xz8", "wg", "ws1", "wz1", "ys",
                                              "yz8"], ["yg"], group=2, strides=[2, 2])]
    inits = [const("xs", np.float32(0.03)), const("xz", np.uint8(110)),
             const("w", i8(rng, (4, 2, 3, 3))),
             const("ws", np.array([0.004, 0.01, 0.002, 0.007], np.float32)),
             const("wz", np.zeros(4, np.int8)), const("ys", np.float32(0.4)),
             const("yz", np.uint8(128)), const("b", rng.integers(-500, 500, 4, dtype=np.int32)),
             const("xz8", np.int8(4)), const("wg", i8(rng, (4, 1, 3, 3))),
             const("ws1", np.float32(0.005)), const("wz1", np.int8(0)), const("yz8", np.int8(-2))]
    outs = [("y", U8, ["batch", 4, 5, 5]), ("yg", I8, ["batch", 4, 2, 2])]
    feeds = {"x": u8(rng, (2, 2, 5, 5)), "x8": i8(rng, (2, 2, 5, 5))}
    return model(nodes, [("x", U8, ["batch", 2, 5, 5]), ("x8", I8, ["batch", 2, 5, 5])], outs,
                 inits), feeds


def dynamic_quantize(rng):
    """DynamicQuantizeLinear, and its scale and zero point through DequantizeLinear."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["back"])]
    outs = [("q", U8, ["batch", 7]), ("back", F, ["batch", 7])]
    x = (rng.standard_normal((1, 7)) * 3 + 1).astype(np.float32)
    return model(nodes, [("x", F, ["batch", 7])], outs, []), {"x": x}


CASES = {
    "quant_matmul_integer": matmul_integer,
    "quant_conv_integer": conv_integer,
    "quant_qlinear_matmul": lambda rng: qlinear_matmul(rng, 13),
    "quant_qlinear_matmul_opset21": lambda rng: qlinear_matmul(rng, 21),
    "quant_qlinear_conv": qlinear_conv,
    "quant_dynamic_quantize": dynamic_quantize,
}


# --------------------------------------------------------------------------- quantizer output


def tiny_mlp(rng):
    """[batch, 16] -> MatMul 24 + Add, Relu -> MatMul 10 + Add."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    inits = [const("w1", rng.standard_normal((16, 24)).astype(np.float32) * 0.3),
             const("b1", rng.standard_normal(24).astype(np.float32) * 0.1),
             const("w2", rng.standard_normal((24, 10)).astype(np.float32) * 0.3),
             const("b2", rng.standard_normal(10).astype(np.float32) * 0.1)]
    return model(nodes, [("x", F, ["batch", 16])], [("y", F, ["batch", 10])], inits, 13)


def tiny_cnn(rng):
    """[batch, 3, 12, 12] -> Conv 8 3x3 pad 1, Relu -> Conv 8 3x3 stride 2, Relu
    -> Flatten -> MatMul 10 + Add."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("MatMul", ["f", "w3"], ["o"]), helper.make_node("Add", ["o", "b3"], ["y"])]
    inits = [const("w1", rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3),
             const("b1", rng.standard_normal(8).astype(np.float32) * 0.1),
             const("w2", rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.15),
             const("b2", rng.standard_normal(8).astype(np.float32) * 0.1),
             const("w3", rng.standard_normal((8 * 6 * 6, 10)).astype(np.float32) * 0.05),
             const("b3", rng.standard_normal(10).astype(np.float32) * 0.1)]
    return model(nodes, [("x", F, ["batch", 3, 12, 12])], [("y", F, ["batch", 10])], inits, 13)


class Calibration:
    def __init__(self, name, batches):
        self.it = iter([{name: b} for b in batches])

    def get_next(self):
        return next(self.it, None)


def export_quantized(out, write_model, rng):
    from onnxruntime import quantization as q

    tmp = pathlib.Path(tempfile.mkdtemp())
    mlp, cnn = tiny_mlp(rng), tiny_cnn(rng)
    onnx.save(mlp, str(tmp / "mlp.onnx"))
    onnx.save(cnn, str(tmp / "cnn.onnx"))
    x_mlp = rng.standard_normal((1, 16)).astype(np.float32)
    x_cnn = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)

    def calib(name, shape):
        return Calibration(name, [rng.standard_normal(shape).astype(np.float32) for _ in range(4)])

    def save(path):
        return lambda p: onnx.save(onnx.load(str(path)), str(p))

    q.quantize_dynamic(str(tmp / "mlp.onnx"), str(tmp / "mlp_dyn.onnx"),
                       weight_type=q.QuantType.QInt8)
    write_model(out, "quant_mlp_dynamic", save(tmp / "mlp_dyn.onnx"), {"x": x_mlp})
    q.quantize_dynamic(str(tmp / "mlp.onnx"), str(tmp / "mlp_dyn_pc.onnx"),
                       weight_type=q.QuantType.QUInt8, per_channel=True)
    write_model(out, "quant_mlp_dynamic_per_channel", save(tmp / "mlp_dyn_pc.onnx"),
                {"x": x_mlp})
    for fmt, name in ((q.QuantFormat.QOperator, "quant_cnn_qoperator"),
                      (q.QuantFormat.QDQ, "quant_cnn_qdq")):
        dst = tmp / f"{name}.onnx"
        q.quantize_static(str(tmp / "cnn.onnx"), str(dst), calib("x", (2, 3, 12, 12)),
                          quant_format=fmt, op_types_to_quantize=["Conv", "MatMul"],
                          per_channel=True, activation_type=q.QuantType.QUInt8,
                          weight_type=q.QuantType.QInt8)
        write_model(out, name, save(dst), {"x": x_cnn})
    q.quantize_static(str(tmp / "mlp.onnx"), str(tmp / "mlp_qop.onnx"), calib("x", (2, 16)),
                      quant_format=q.QuantFormat.QOperator, op_types_to_quantize=["MatMul"])
    write_model(out, "quant_mlp_qoperator", save(tmp / "mlp_qop.onnx"),
                {"x": rng.standard_normal((2, 16)).astype(np.float32)})


def tiny_resnet(rng):
    """A ResNet in miniature: [batch, 3, 16, 16] -> Conv 16 3x3 stride 2 + Relu ->
    MaxPool 3x3 stride 2 -> a basic block (Conv 16 3x3 + Relu, Conv 16 3x3, Add of
    the block's input, Relu) -> a downsampling block (its shortcut a 1x1 stride-2
    Conv) -> GlobalAveragePool -> Flatten -> Gemm 10."""
    nodes, inits = [], []

    def conv(x, cin, cout, k, stride, name, relu):
        inits.append(const(name + "_w", rng.standard_normal((cout, cin, k, k)).astype(np.float32)
                           * np.float32(1.5 / np.sqrt(cin * k * k))))
        inits.append(const(name + "_b", rng.standard_normal(cout).astype(np.float32) * 0.1))
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name],
                                      pads=[k // 2] * 4, strides=[stride, stride]))
        if not relu:
            return name
        nodes.append(helper.make_node("Relu", [name], [name + "_r"]))
        return name + "_r"

    def add_relu(a, b, name):
        nodes.append(helper.make_node("Add", [a, b], [name]))
        nodes.append(helper.make_node("Relu", [name], [name + "_r"]))
        return name + "_r"

    h = conv("x", 3, 16, 3, 2, "stem", True)
    nodes.append(helper.make_node("MaxPool", [h], ["pool"], kernel_shape=[3, 3], pads=[1] * 4,
                                  strides=[2, 2]))
    b1 = conv(conv("pool", 16, 16, 3, 1, "b1c1", True), 16, 16, 3, 1, "b1c2", False)
    h = add_relu(b1, "pool", "b1")
    b2 = conv(conv(h, 16, 32, 3, 2, "b2c1", True), 32, 32, 3, 1, "b2c2", False)
    h = add_relu(b2, conv(h, 16, 32, 1, 2, "b2down", False), "b2")
    nodes += [helper.make_node("GlobalAveragePool", [h], ["gap"]),
              helper.make_node("Flatten", ["gap"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1)]
    inits += [const("fc_w", rng.standard_normal((10, 32)).astype(np.float32) * 0.3),
              const("fc_b", rng.standard_normal(10).astype(np.float32) * 0.1)]
    return model(nodes, [("x", F, ["batch", 3, 16, 16])], [("y", F, ["batch", 10])], inits, 17)


def export_qdq_resnet(out, write_model, seed=116):
    """tiny_resnet quantized as run_bench.py quantizes ResNet-50 (quantize_static,
    QDQ, INT8 activations and weights per tensor): the groups the engine's
    fuse_qdq rewrites (Conv with Relu folded into its Q, the residual Add) and
    those it keeps in fp32 (MaxPool, GlobalAveragePool, Gemm). Its own seed,
    so that adding it changed no other fixture."""
    from onnxruntime import quantization as q

    rng = np.random.default_rng(seed)
    tmp = pathlib.Path(tempfile.mkdtemp())
    onnx.save(tiny_resnet(rng), str(tmp / "resnet.onnx"))
    calib = Calibration("x", [rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
                              for _ in range(4)])
    q.quantize_static(str(tmp / "resnet.onnx"), str(tmp / "resnet_qdq.onnx"), calib,
                      quant_format=q.QuantFormat.QDQ, activation_type=q.QuantType.QInt8,
                      weight_type=q.QuantType.QInt8)
    x = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
    write_model(out, "quant_resnet_qdq",
                lambda p: onnx.save(onnx.load(str(tmp / "resnet_qdq.onnx")), str(p)), {"x": x})


def export(out, write_model, seed=110):
    """Writes every case with export_onnx_models.write_model (which checks the
    model, runs ONNX Runtime and writes config.pbtxt and the reference)."""
    rng = np.random.default_rng(seed)
    for name, build in CASES.items():
        m, feeds = build(rng)
        write_model(out, name, lambda p, m=m: onnx.save(m, str(p)), feeds)
    export_quantized(out, write_model, rng)
    export_qdq_resnet(out, write_model)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    from export_onnx_models import write_model as _write

    export(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1
           else pathlib.Path(__file__).parent.parent / "tests" / "onnx" / "fixtures", _write)
