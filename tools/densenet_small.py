#!/usr/bin/env python3
"""Writes examples/models/densenet_small: a small image classifier in the layout of Triton's
densenet_onnx example (docs/examples/model_repository/densenet_onnx), for tritonclient's
image_client.py. It has random weights; what it shows is the plumbing: an input with
format FORMAT_NCHW and dims [3,224,224] that the model takes as [1,3,224,224] (reshape),
and a [1,1000,1,1] output that clients see as [1000] (reshape) with a label file.

    python3 tools/densenet_small.py [--out examples/models]

Needs only onnx and numpy (no torch); tools/export_onnx_models.py `examples` calls it too.
The graph is DenseNet's pattern in miniature: a strided stem, a dense block whose layers
concatenate their inputs, a transition, global pooling and a 1x1 convolution as the
classifier (DenseNet-121's fc6 is a convolution too, hence the [1,1000,1,1] output).
"""
import argparse
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CLASSES = 1000

CONFIG = """name: "densenet_small"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""


def build(seed=15):
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def weight(name, shape):
        fan_in = int(np.prod(shape[1:]))
        w = rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        inits.append(numpy_helper.from_array(w, name))
        return name

    def bias(name, n):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(n) * 0.1).astype(np.float32), name))
        return name

    def conv(x, name, cin, cout, k, stride=1, relu=True):
        pad = k // 2
        nodes.append(helper.make_node(
            "Conv", [x, weight(name + "_w", (cout, cin, k, k)), bias(name + "_b", cout)],
            [name], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4))
        if not relu:
            return name
        nodes.append(helper.make_node("Relu", [name], [name + "_relu"]))
        return name + "_relu"

    x = conv("data_0", "conv0", 3, 16, 7, 2)                      # 16 x 112 x 112
    nodes.append(helper.make_node("MaxPool", [x], ["pool0"], kernel_shape=[3, 3],
                                  strides=[2, 2], pads=[1, 1, 1, 1]))  # 16 x 56 x 56
    features, channels = "pool0", 16
    for i in range(3):  # dense block: each layer sees every earlier layer's output
        y = conv(features, f"dense{i}", channels, 8, 3)
        nodes.append(helper.make_node("Concat", [features, y], [f"concat{i}"], axis=1))
        features, channels = f"concat{i}", channels + 8            # 24, 32, 40
    x = conv(features, "transition", channels, 32, 1)
    nodes.append(helper.make_node("AveragePool", [x], ["pool1"], kernel_shape=[2, 2],
                                  strides=[2, 2]))                  # 32 x 28 x 28
    x = conv("pool1", "conv1", 32, 64, 3, 2)                       # 64 x 14 x 14
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"]))
    conv("gap", "fc6_1", 64, CLASSES, 1, relu=False)               # 1000 x 1 x 1

    graph = helper.make_graph(
        nodes, "densenet_small",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, CLASSES, 1, 1])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="caf-serving tools/densenet_small.py")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def write(out):
    model_dir = pathlib.Path(out) / "densenet_small"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(build(), str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text(CONFIG)
    (model_dir / "densenet_labels.txt").write_text(
        "".join(f"CLASS_{i:04d}\n" for i in range(CLASSES)))
    size = (model_dir / "1" / "model.onnx").stat().st_size
    print(f"densenet_small: {size / 1e6:.2f} MB in {model_dir}")


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=str(root / "examples" / "models"),
                    help="the model repository to write densenet_small into")
    write(ap.parse_args().out)


if __name__ == "__main__":
    main()
