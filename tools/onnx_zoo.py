"""The model zoo: the ONNX models users export today, to check caf-serving against (issue 16).

    python3 tools/export_onnx_models.py zoo --out DIR [--families resnet18,bert]
                                            [--exporters torchscript13,torchscript17,dynamo]
                                            [--ort-optimized] [--subset]
    scripts/onnx-zoo-check DIR              # serves DIR/models, compares with DIR/reference

Each family (torchvision vision models, transformers text models in tiny configs, all with
random weights: nothing is downloaded) is exported by both of torch's exporters:
  torchscript<N>  torch.onnx.export(..., dynamo=False, opset_version=N)       N = 13, 17
  dynamo          torch.onnx.export(..., dynamo=True) at the exporter's default opset
  dynamo<N>       the same at opset N (18 or newer)
with a dynamic batch axis (and a dynamic sequence axis for text), and ONNX Runtime's outputs
on fixed random inputs are written as the reference. --ort-optimized adds each text model
after onnxruntime.transformers.optimizer.optimize_model (com.microsoft fused operators), as
people also serve them.

DIR/models/<family>_<exporter>_opset<N>/{config.pbtxt,1/model.onnx} is Triton's layout;
DIR/reference/<same>/ has manifest.txt (one line per tensor:
input|output <name> <TYPE_...> <dims comma-separated> <file.bin>), the raw little-endian
.bin files, and info.txt: what the model uses (opset, operators by domain with their count
and the version of their schema in effect, tensor element types, symbolic dimensions), so that the check can say what blocks a model beyond
the first error the server reports. An export that torch itself fails on is skipped with a
line saying why (and listed in DIR/skipped.txt).

--subset writes small models (KBs) with the dynamo exporter's patterns at opsets 18 and 20
(subset_models()) instead; the ones main serves are committed in tests/onnx/fixtures:
    export_onnx_models.py zoo --subset --families zoo_mobilenet_v3_block --out tests/onnx/fixtures
    export_onnx_models.py zoo --subset --families zoo_vit_tiny --exporters dynamo18 \
        --out tests/onnx/fixtures
(zoo_bert_1layer and zoo_gpt2_1layer wait for GatherND, and at opset 20 for Gelu).
"""
import collections
import os
import pathlib
import re
import time
import traceback

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn

# By dtype name: ONNX Runtime answers INT64 as numpy.longlong, another type than numpy.int64.
TRITON_TYPE = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "int64": "TYPE_INT64",
               "int32": "TYPE_INT32", "bool": "TYPE_BOOL"}
ONNX_TRITON_TYPE = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16",
                    onnx.TensorProto.INT64: "TYPE_INT64", onnx.TensorProto.INT32: "TYPE_INT32",
                    onnx.TensorProto.BOOL: "TYPE_BOOL", onnx.TensorProto.BFLOAT16: "TYPE_BF16",
                    onnx.TensorProto.UINT8: "TYPE_UINT8", onnx.TensorProto.INT8: "TYPE_INT8"}

DEFAULT_EXPORTERS = ["torchscript13", "torchscript17", "dynamo", "dynamo18"]


# --------------------------------------------------------------------------- families


class zoo_model:
    """One family's module and example inputs. `axes` names each input's dynamic axes
    ({0: "batch"} or {0: "batch", 1: "sequence"}); outputs get theirs from the graph."""

    def __init__(self, module, inputs, outputs, axes, kind):
        self.module = module.eval()
        self.inputs = inputs          # ordered {name: numpy array}
        self.outputs = outputs        # output names, in the module's return order
        self.axes = axes              # {input name: {axis: name}}
        self.kind = kind              # "vision" or "text"


def randomize_batchnorm(model, gen):
    """Random running statistics, so that BatchNorm folding is tested with values that matter
    (torchvision's fresh models have mean 0, variance 1)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(n, generator=gen) * 0.1)
    return model


def randomize_constant_parameters(model, gen):
    """Parameters a fresh model holds at one value (ViT-B/16's zero classifier head, ConvNeXt's
    layer scales of 1e-6, zero biases, unit norm weights) get random values around it, so that
    every path of the graph changes the outputs the check compares (with a zero head every
    output is 0 and any engine matches)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                scale = max(float(p.flatten()[0].abs()), 0.1)
                p.add_(torch.randn(p.shape, generator=gen) * scale * 0.5)
    return model


class first_output(nn.Module):
    """torchvision's GoogLeNet and Inception v3 return named tuples in training mode only,
    but keep them out of the exported graph's signature in any case."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        y = self.model(x)
        return y[0] if isinstance(y, tuple) else y


def vision(name, hw, seed, **kw):
    import torchvision
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(weights=None, num_classes=10, **kw)
    randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1))
    randomize_constant_parameters(model, torch.Generator().manual_seed(seed + 2))
    x = np.random.default_rng(seed).standard_normal((2, 3, hw, hw), dtype=np.float32)
    return zoo_model(first_output(model), {"input": x}, ["logits"], {"input": {0: "batch"}},
                     "vision")


class text_wrapper(nn.Module):
    """Calls a transformers model with keyword inputs and returns its outputs as a tuple
    of the named fields, so both exporters see plain tensors in and out."""

    def __init__(self, model, input_names, output_names):
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.output_names = output_names

    def forward(self, *args):
        out = self.model(**dict(zip(self.input_names, args)), return_dict=True)
        return tuple(out[n] for n in self.output_names)


TEXT_SEQUENCE = 8  # the references' sequence length


def text_inputs(names, vocab, seed, batch=2, seq=TEXT_SEQUENCE):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), dtype=np.int64)
    for b in range(1, batch):  # padding at the end of all but the first row
        mask[b, seq - (b * 3) % seq:] = 0
    types = np.zeros((batch, seq), dtype=np.int64)
    types[:, seq // 2:] = 1
    all_inputs = {"input_ids": rng.integers(0, vocab, (batch, seq), dtype=np.int64),
                  "attention_mask": mask, "token_type_ids": types}
    return {n: all_inputs[n] for n in names}


def text(model_cls, config_cls, seed, inputs, outputs, vocab=512, **cfg):
    import transformers
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**cfg)
    model = getattr(transformers, model_cls)(config).eval()
    feeds = text_inputs(inputs, vocab, seed)
    return zoo_model(text_wrapper(model, inputs, outputs), feeds, outputs,
                     {n: {0: "batch", 1: "sequence"} for n in inputs}, "text")


BERT_SHAPE = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=64)
BERT_IO = (["input_ids", "attention_mask", "token_type_ids"],
           ["last_hidden_state", "pooler_output"])


def clip_vision(seed):
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, image_size=32, patch_size=8)
    model = transformers.CLIPVisionModel(cfg).eval()
    x = np.random.default_rng(seed).standard_normal((2, 3, 32, 32), dtype=np.float32)
    outs = ["last_hidden_state", "pooler_output"]
    return zoo_model(text_wrapper(model, ["pixel_values"], outs), {"pixel_values": x}, outs,
                     {"pixel_values": {0: "batch"}}, "vision")


# name -> builder. Vision inputs are 64x64 where the model's structure allows it (Inception v3
# needs 75x75 at least; ViT-B/16 is built for 32x32 with its 16x16 patches: 4 tokens; VGG-11's
# AdaptiveAvgPool2d(7) exports with TorchScript only where 7 divides the 1/32 feature map: 224).
FAMILIES = {
    "resnet18": lambda: vision("resnet18", 64, 101),
    "mobilenet_v2": lambda: vision("mobilenet_v2", 64, 102),
    "mobilenet_v3_small": lambda: vision("mobilenet_v3_small", 64, 103),
    "efficientnet_b0": lambda: vision("efficientnet_b0", 64, 104),
    "regnet_y_400mf": lambda: vision("regnet_y_400mf", 64, 105),
    "convnext_tiny": lambda: vision("convnext_tiny", 64, 106),
    "densenet121": lambda: vision("densenet121", 64, 107),
    "googlenet": lambda: vision("googlenet", 64, 108, aux_logits=False, init_weights=True),
    "inception_v3": lambda: vision("inception_v3", 96, 109, aux_logits=False, init_weights=True),
    "shufflenet_v2_x0_5": lambda: vision("shufflenet_v2_x0_5", 64, 110),
    "squeezenet1_0": lambda: vision("squeezenet1_0", 64, 111),
    "vgg11": lambda: vision("vgg11", 224, 112),
    "vit_b_16": lambda: vision("vit_b_16", 32, 113, image_size=32),
    "swin_t": lambda: vision("swin_t", 64, 114),
    "bert": lambda: text("BertModel", "BertConfig", 201, *BERT_IO, **BERT_SHAPE),
    "roberta": lambda: text("RobertaModel", "RobertaConfig", 202, ["input_ids", "attention_mask"],
                            ["last_hidden_state", "pooler_output"],
                            **dict(BERT_SHAPE, max_position_embeddings=66)),
    "distilbert": lambda: text("DistilBertModel", "DistilBertConfig", 203,
                               ["input_ids", "attention_mask"], ["last_hidden_state"],
                               vocab_size=512, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                               max_position_embeddings=64),
    "albert": lambda: text("AlbertModel", "AlbertConfig", 204, *BERT_IO,
                           **dict(BERT_SHAPE, embedding_size=32)),
    "electra": lambda: text("ElectraModel", "ElectraConfig", 205, BERT_IO[0],
                            ["last_hidden_state"], **dict(BERT_SHAPE, embedding_size=32)),
    "minilm": lambda: text("BertModel", "BertConfig", 206, *BERT_IO,
                           **dict(BERT_SHAPE, intermediate_size=256)),
    "gpt2": lambda: text("GPT2Model", "GPT2Config", 207, ["input_ids", "attention_mask"],
                         ["last_hidden_state"], vocab_size=512, n_embd=64, n_layer=2, n_head=4,
                         n_positions=64, use_cache=False),
    "t5_encoder": lambda: text("T5EncoderModel", "T5Config", 208,
                               ["input_ids", "attention_mask"], ["last_hidden_state"],
                               vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                               num_heads=4, use_cache=False),
    "clip_text": lambda: text("CLIPTextModel", "CLIPTextConfig", 209,
                              ["input_ids", "attention_mask"],
                              ["last_hidden_state", "pooler_output"], vocab_size=512,
                              hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, max_position_embeddings=64),
    "clip_vision": lambda: clip_vision(210),
}

TEXT_MODEL_TYPE = {"bert": "bert", "roberta": "bert", "distilbert": "bert", "albert": "bert",
                   "electra": "bert", "minilm": "bert", "gpt2": "gpt2", "t5_encoder": "t5",
                   "clip_text": "clip", "clip_vision": "vit"}


# --------------------------------------------------------------------------- export


def set_attention(module, impl):
    """transformers' attention implementation ("sdpa" by default, "eager": MatMul, Softmax,
    MatMul); returns the one it replaced, or None for a module without one."""
    cfg = getattr(getattr(module, "model", None), "config", None)
    if cfg is None or not hasattr(cfg, "_attn_implementation"):
        return None
    old = cfg._attn_implementation
    for mod in module.modules():
        c = getattr(mod, "config", None)
        if c is not None and hasattr(c, "_attn_implementation"):
            try:
                c._attn_implementation = impl
            except Exception:
                pass
    return old


def export_torchscript(m, path, opset):
    """TorchScript's exporter has scaled_dot_product_attention from opset 14 on only; below,
    the model is exported with transformers' eager attention, as people do for opset 13."""
    old = set_attention(m.module, "eager") if opset < 14 else None
    try:
        export_torchscript_as_is(m, path, opset)
    finally:
        if old is not None:
            set_attention(m.module, old)


def export_torchscript_as_is(m, path, opset):
    names = list(m.inputs)
    dyn = dict(m.axes)
    for o in m.outputs:  # pooler_output and vision outputs have no sequence axis
        seq = m.kind == "text" and o != "pooler_output"
        dyn[o] = {0: "batch", 1: "sequence"} if seq else {0: "batch"}
    args = tuple(torch.from_numpy(v) for v in m.inputs.values())
    torch.onnx.export(m.module, args, str(path), dynamo=False, input_names=names,
                      output_names=m.outputs, dynamic_axes=dyn, opset_version=opset,
                      do_constant_folding=True)


def export_dynamo(m, path, opset):
    from torch.export import Dim
    dims = {}
    shapes = []
    for name, axes in m.axes.items():
        shapes.append({a: dims.setdefault(d, Dim(d, min=1, max=64)) for a, d in axes.items()})
    args = tuple(torch.from_numpy(v) for v in m.inputs.values())
    # text_wrapper.forward(*args): torch.export sees one argument, the tuple.
    shapes = (tuple(shapes),) if isinstance(m.module, text_wrapper) else tuple(shapes)
    kw = dict(input_names=list(m.inputs), output_names=m.outputs,
              dynamic_shapes=shapes, dynamo=True, external_data=False)
    if opset:
        kw["opset_version"] = opset
    # Under torch.no_grad(), as the TorchScript export is not: with gradients on torch.export
    # fails on T5's attention (it cannot view the transposed key states).
    with torch.no_grad():
        prog = torch.onnx.export(m.module, args, **kw)
    prog.save(str(path))


def dynamo_default_opset():
    """torch.onnx.export(..., dynamo=True)'s opset when none is asked for (20 in torch 2.15)."""
    try:
        from torch.onnx import _constants
        return _constants.ONNX_DEFAULT_OPSET
    except Exception:
        return 18


def exporter_variants(spec):
    """["torchscript13", "dynamo", ...] -> [(exporter, opset or None)]."""
    out = []
    for s in spec:
        s = s.strip()
        if s.startswith("torchscript"):
            out.append(("torchscript", int(s[len("torchscript"):])))
        elif s == "dynamo":
            out.append(("dynamo", None))
        elif s.startswith("dynamo"):
            out.append(("dynamo", int(s[len("dynamo"):])))
        else:
            raise SystemExit(f"unknown exporter '{s}': torchscript<N>, dynamo or dynamo<N>")
    return out


def dims_of(value_info):
    t = value_info.type.tensor_type
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]


def model_info(model):
    """info.txt's lines: what the graph uses, for the check's work list."""
    lines = []
    for o in model.opset_import:
        lines.append(f"opset {o.domain or 'ai.onnx'} {o.version}")
    ops = collections.Counter()
    types = collections.Counter()

    def walk(g):
        for n in g.node:
            ops[(n.domain or "ai.onnx", n.op_type)] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                elif a.type == onnx.AttributeProto.TENSOR:
                    types[onnx.TensorProto.DataType.Name(a.t.data_type)] += 1
        for t in g.initializer:
            types[onnx.TensorProto.DataType.Name(t.data_type)] += 1
        for v in list(g.value_info) + list(g.input) + list(g.output):
            if v.type.HasField("tensor_type"):
                types[onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)] += 1

    walk(model.graph)
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    for (dom, op), n in sorted(ops.items()):
        # The version of the operator's schema in effect at the model's opset: an operator
        # whose schema changed after the engine's newest opset needs the new version's rules.
        try:
            since = onnx.defs.get_schema(op, opsets.get(dom, 1),
                                         "" if dom == "ai.onnx" else dom).since_version
        except Exception:
            since = 0
        lines.append(f"op {dom} {op} {n} {since}")
    for t, n in sorted(types.items()):
        lines.append(f"type {t} {n}")
    for kind, vs in (("input", model.graph.input), ("output", model.graph.output)):
        inits = {t.name for t in model.graph.initializer}
        for v in vs:
            if v.name in inits:
                continue
            lines.append(f"{kind} {v.name} "
                         f"{onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)} "
                         f"{','.join(str(d) for d in dims_of(v))}")
    if any(t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL
           for t in model.graph.initializer):
        lines.append("external_data yes")
    return lines


def config_pbtxt(name, model, max_batch_size=8, fixed=None):
    """Triton's config: inputs and outputs from the graph, the batch axis left out and every
    other symbolic dimension -1, or its size in `fixed` ({"sequence": 8}: what a user of an
    engine without variable dimensions writes). Batching with dynamic batching when axis 0
    is symbolic."""
    fixed = fixed or {}
    inits = {t.name for t in model.graph.initializer}
    ins = [v for v in model.graph.input if v.name not in inits]
    batched = all(dims_of(v) and isinstance(dims_of(v)[0], str)
                  for v in list(ins) + list(model.graph.output))
    lines = [f'name: "{name}"', 'platform: "onnxruntime_onnx"',
             f"max_batch_size: {max_batch_size if batched else 0}"]

    def io(kind, vs):
        items = []
        for v in vs:
            d = dims_of(v)[1:] if batched else dims_of(v)
            dims = ", ".join(str(x) if isinstance(x, int) else str(fixed.get(x, -1)) for x in d)
            t = ONNX_TRITON_TYPE.get(v.type.tensor_type.elem_type, "TYPE_INVALID")
            items.append(f'  {{ name: "{v.name}" data_type: {t} dims: [ {dims} ] }}')
        return f"{kind} [\n" + ",\n".join(items) + "\n]"

    lines.append(io("input", ins))
    lines.append(io("output", model.graph.output))
    if batched:
        lines.append("dynamic_batching { max_queue_delay_microseconds: 200 }")
    return "\n".join(lines) + "\n"


def write_reference(out, name, onnx_file, inputs, model):
    sess_opts = ort.SessionOptions()
    sess_opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(onnx_file), sess_opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: inputs[i.name] for i in sess.get_inputs()}
    outs = sess.run(None, feeds)
    out_names = [o.name for o in sess.get_outputs()]
    ref_dir = out / "reference" / name
    ref_dir.mkdir(parents=True, exist_ok=True)
    manifest = []
    for kind, pairs in (("input", list(feeds.items())), ("output", list(zip(out_names, outs)))):
        for n, a in pairs:
            a = np.ascontiguousarray(a)
            fname = f"{kind}_{n}.bin".replace("/", "_")
            a.tofile(ref_dir / fname)
            manifest.append(f"{kind} {n} {TRITON_TYPE[a.dtype.name]} "
                            f"{','.join(str(d) for d in a.shape)} {fname}")
    (ref_dir / "manifest.txt").write_text("\n".join(manifest) + "\n")
    (ref_dir / "info.txt").write_text("\n".join(model_info(model)) + "\n")
    return outs


def default_opset_of(model):
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def write_model(out, name, write_onnx, inputs, fixed=None, check=True):
    """<out>/models/<name>/{config.pbtxt,1/model.onnx} and <out>/reference/<name>/. `name`
    may be a function of the opset the exported model imports (the dynamo exporter raises it
    above the one asked for where an operator needs a newer one, e.g. Gelu to 20); returns
    (name, bytes, ONNX Runtime's outputs)."""
    import shutil
    tmp = out / "models" / f".export-tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "1").mkdir(parents=True)
    try:
        write_onnx(tmp / "1" / "model.onnx")
        model = onnx.load(str(tmp / "1" / "model.onnx"))
        if check:  # onnxruntime's optimizer leaves ai.onnx operators ONNX's checker refuses
            onnx.checker.check_model(model)
        if callable(name):
            name = name(default_opset_of(model))
        model_dir = out / "models" / name
        shutil.rmtree(model_dir, ignore_errors=True)
        tmp.rename(model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    onnx_file = model_dir / "1" / "model.onnx"
    (model_dir / "config.pbtxt").write_text(config_pbtxt(name, model, fixed=fixed))
    try:
        outs = write_reference(out, name, onnx_file, inputs, model)
    except Exception:
        shutil.rmtree(model_dir, ignore_errors=True)
        raise
    return name, onnx_file.stat().st_size, outs


def ort_optimized(src, dst, family):
    from onnxruntime.transformers.optimizer import optimize_model
    opt = optimize_model(str(src), model_type=TEXT_MODEL_TYPE[family], num_heads=4,
                         hidden_size=64, opt_level=1)
    opt.save_model_to_file(str(dst))


def first_line(e):
    text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(e).__name__}: {e}").strip().splitlines()
    # torch.onnx's dynamo errors: the cause is under "## Exception summary".
    if "## Exception summary" in text:
        rest = [l for l in text[text.index("## Exception summary") + 1:] if l.strip()]
        if rest:
            return rest[0].strip()[:300]
    # torch's export errors start with a banner; the first line that says something.
    for line in text:
        if line.strip() and not set(line.strip()) <= set("=-#*"):
            return line.strip()[:300]
    return type(e).__name__


def export_zoo(out, families=None, exporters=None, with_ort_optimized=False, fixed=None):
    out = pathlib.Path(out)
    families = families or list(FAMILIES)
    variants = exporter_variants(exporters or DEFAULT_EXPORTERS)
    default_opset = dynamo_default_opset()
    # "dynamo" and "dynamo<its default>" are the same export: one of them.
    seen = set()
    uniq = []
    for exp, opset in variants:
        key = (exp, opset or default_opset if exp == "dynamo" else opset)
        if key not in seen:
            seen.add(key)
            uniq.append((exp, opset))
    skipped = []
    attempted = set()
    total = len(families) * len(uniq)
    k = 0
    for fam in families:
        if fam not in FAMILIES:
            raise SystemExit(f"unknown family '{fam}'; the families: {', '.join(FAMILIES)}")
        try:
            m = FAMILIES[fam]()
        except Exception as e:
            for exp, opset in uniq:
                k += 1
                name = f"{fam}_{exp}_opset{opset or default_opset}"
                attempted.add(name)
                skipped.append(f"{name}: building the model failed: {first_line(e)}")
                print(f"[{k}/{total}] {name}: SKIPPED (building the model failed: {first_line(e)})",
                      flush=True)
            continue
        for exp, opset in uniq:
            k += 1
            asked = opset or default_opset
            label = f"{fam}_{exp}_opset{asked}"
            t0 = time.time()
            writer = ((lambda p, m=m, o=opset: export_torchscript(m, p, o)) if exp == "torchscript"
                      else (lambda p, m=m, o=opset: export_dynamo(m, p, o)))
            attempted.add(label)
            try:
                # Not under torch.no_grad() (export_dynamo sets it for itself): in eval mode
                # without gradients nn.MultiheadAttention takes its fused fast path
                # (aten::_native_multi_head_attention), which the TorchScript exporter cannot
                # export (ViT-B/16); people export without it.
                name, size, outs = write_model(out, lambda got: f"{fam}_{exp}_opset{got}",
                                               writer, m.inputs, fixed)
            except Exception as e:
                why = first_line(e)
                skipped.append(f"{label}: {exp} export failed: {why}")
                print(f"[{k}/{total}] {label}: SKIPPED ({exp} export failed: {why})", flush=True)
                (out / "logs").mkdir(parents=True, exist_ok=True)
                (out / "logs" / f"{label}.txt").write_text(traceback.format_exc())
                continue
            note = "" if name == label else f" (asked for opset {asked})"
            print(f"[{k}/{total}] {name}{note}: {size / 1e6:.2f} MB, outputs "
                  f"{[tuple(o.shape) for o in outs]}, {time.time() - t0:.1f} s", flush=True)
            if with_ort_optimized and (m.kind == "text" or fam == "clip_vision"):
                oname = f"{name}_ortopt"
                src = out / "models" / name / "1" / "model.onnx"
                try:
                    _, size, _ = write_model(out, oname, lambda p: ort_optimized(src, p, fam),
                                             m.inputs, fixed, check=False)
                    print(f"        {oname}: {size / 1e6:.2f} MB", flush=True)
                except Exception as e:
                    skipped.append(f"{oname}: onnxruntime's optimizer failed: {first_line(e)}")
                    print(f"        {oname}: SKIPPED ({first_line(e)})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    # skipped.txt keeps the failures of earlier runs into the same directory (--families).
    old = (out / "skipped.txt").read_text().split("\n") if (out / "skipped.txt").exists() else []
    kept = [l for l in old if l.strip() and l.split(":")[0] not in attempted
            and not l.split(":")[0].replace("_ortopt", "") in attempted]
    (out / "skipped.txt").write_text("".join(s + "\n" for s in kept + skipped))
    print(f"zoo: {k - len(skipped)} of {k} exports written to {out}/models, "
          f"{len(skipped)} skipped (listed in {out}/skipped.txt)")


# --------------------------------------------------------------------------- the subset


def subset_models():
    """Small models (KBs to a few hundred KB) with the patterns the dynamo exporter writes at
    opset 18 and newer, for tests/onnx/fixtures: only the batch axis is dynamic, as in the
    other fixtures, so that they test operators and opsets rather than variable dimensions."""
    from torchvision.models.mobilenetv3 import InvertedResidual, InvertedResidualConfig

    def fixed_seq(m):
        m.axes = {n: {0: "batch"} for n in m.axes}
        return m

    def text_small(model_cls, config_cls, seed, inputs, outputs, **cfg):
        return fixed_seq(text(model_cls, config_cls, seed, inputs, outputs, vocab=128, **cfg))

    small = dict(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=32)

    def mobilenet_v3_block():
        torch.manual_seed(301)
        cfg = InvertedResidualConfig(16, 3, 48, 16, True, "HS", 1, 1, 1.0)
        block = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.Hardswish(),
                              InvertedResidual(cfg, nn.BatchNorm2d),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
        randomize_batchnorm(block, torch.Generator().manual_seed(302))
        x = np.random.default_rng(301).standard_normal((2, 3, 16, 16), dtype=np.float32)
        return zoo_model(block, {"input": x}, ["logits"], {"input": {0: "batch"}}, "vision")

    def vit_tiny():
        from torchvision.models.vision_transformer import VisionTransformer
        torch.manual_seed(303)
        model = VisionTransformer(image_size=16, patch_size=8, num_layers=1, num_heads=2,
                                  hidden_dim=32, mlp_dim=64, num_classes=10)
        randomize_constant_parameters(model, torch.Generator().manual_seed(305))
        x = np.random.default_rng(303).standard_normal((2, 3, 16, 16), dtype=np.float32)
        return zoo_model(model, {"input": x}, ["logits"], {"input": {0: "batch"}}, "vision")

    return {
        "zoo_bert_1layer": lambda: text_small("BertModel", "BertConfig", 311, *BERT_IO, **small),
        "zoo_gpt2_1layer": lambda: text_small("GPT2Model", "GPT2Config", 312,
                                              ["input_ids", "attention_mask"],
                                              ["last_hidden_state"], vocab_size=128, n_embd=32,
                                              n_layer=1, n_head=2, n_positions=32,
                                              use_cache=False),
        "zoo_mobilenet_v3_block": mobilenet_v3_block,
        "zoo_vit_tiny": vit_tiny,
    }


def export_subset(out, exporters=None, only=None):
    variants = exporter_variants(exporters or ["dynamo18", "dynamo"])
    written = 0
    for base, build in subset_models().items():
        if only and base not in only:
            continue
        m = build()
        for exp, opset in variants:
            label = f"{base}_{exp}_opset{opset or dynamo_default_opset()}"
            writer = ((lambda p, m=m, o=opset: export_torchscript(m, p, o)) if exp == "torchscript"
                      else (lambda p, m=m, o=opset: export_dynamo(m, p, o)))
            try:
                name, size, outs = write_model(out, lambda got: f"{base}_{exp}_opset{got}",
                                               writer, m.inputs)
            except Exception as e:
                print(f"{label}: SKIPPED ({exp} export failed: {first_line(e)})", flush=True)
                continue
            written += 1
            print(f"{name}: {size / 1e3:.0f} KB, outputs {[tuple(o.shape) for o in outs]}",
                  flush=True)
    print(f"subset: {written} models written to {out}/models")


def optimize_existing(out, families, fixed=None):
    """--ort-optimized-only: each text model already in <out>/models after onnxruntime's
    transformer optimizer, on the inputs of its reference (no export again)."""
    out = pathlib.Path(out)
    attempted, skipped = set(), []
    for model_dir in sorted((out / "models").iterdir()):
        name = model_dir.name
        fam = re.sub(r"_(torchscript|dynamo)_opset\d+$", "", name)
        if fam not in TEXT_MODEL_TYPE or (families and fam not in families):
            continue
        inputs = {}
        for line in (out / "reference" / name / "manifest.txt").read_text().split("\n"):
            f = line.split()
            if f and f[0] == "input":
                dtype = {v: k for k, v in TRITON_TYPE.items()}[f[2]]
                inputs[f[1]] = np.fromfile(out / "reference" / name / f[4], dtype=dtype).reshape(
                    [int(d) for d in f[3].split(",")])
        oname = f"{name}_ortopt"
        attempted.add(oname)
        src = model_dir / "1" / "model.onnx"
        try:
            _, size, _ = write_model(out, oname, lambda p: ort_optimized(src, p, fam), inputs,
                                     fixed, check=False)
            print(f"{oname}: {size / 1e6:.2f} MB", flush=True)
        except Exception as e:
            skipped.append(f"{oname}: onnxruntime's optimizer failed: {first_line(e)}")
            print(f"{oname}: SKIPPED (onnxruntime's optimizer failed: {first_line(e)})",
                  flush=True)
    sp = out / "skipped.txt"
    old = sp.read_text().split("\n") if sp.exists() else []
    kept = [l for l in old if l.strip() and l.split(":")[0] not in attempted]
    sp.write_text("".join(l + "\n" for l in kept + skipped))


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="export_onnx_models.py zoo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent
                                         / "build-onnx" / "zoo"))
    ap.add_argument("--families", default="", help="comma-separated; default all: "
                    + ", ".join(FAMILIES))
    ap.add_argument("--exporters", default="",
                    help="comma-separated torchscript<N>, dynamo, dynamo<N>; default "
                    + ",".join(DEFAULT_EXPORTERS))
    ap.add_argument("--ort-optimized", action="store_true",
                    help="also each text model after onnxruntime's transformer optimizer")
    ap.add_argument("--ort-optimized-only", action="store_true",
                    help="only add the optimized text models to those already in --out")
    ap.add_argument("--config-sequence", action="store_true",
                    help="config.pbtxt gives the sequence axis the references' length (8) "
                    "instead of -1, as for an engine without variable dimensions; the ONNX "
                    "files stay the same")
    ap.add_argument("--subset", action="store_true",
                    help="the small models for tests/onnx/fixtures instead of the zoo")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, (__import__("os").cpu_count() or 1) // 2))
    exporters = [e for e in args.exporters.split(",") if e] or None
    out = pathlib.Path(args.out)
    fixed = {"sequence": TEXT_SEQUENCE} if args.config_sequence else None
    if args.ort_optimized_only:
        optimize_existing(out, [f for f in args.families.split(",") if f], fixed)
        return
    if args.subset:
        export_subset(out, exporters, [f for f in args.families.split(",") if f])
        return
    export_zoo(out, [f for f in args.families.split(",") if f] or None, exporters,
               args.ort_optimized, {"sequence": TEXT_SEQUENCE} if args.config_sequence else None)


if __name__ == "__main__":
    main()
