#!/usr/bin/env python3
"""Converts a zoo's exports to a newer opset with onnx's version converter.

    python3 tools/onnx_zoo_convert.py SRC DST [--from-opset 25] [--to-opset 28]

torch 2.15 cannot export every family at the newest opset (at 28: "No Op registered for
Attention/Gelu with domain_version of 18"). This takes each SRC/models/*_opset<FROM> export
(what `tools/export_onnx_models.py zoo --exporters dynamo25` wrote) whose family has no
*_opset<TO> export of its own, converts it with onnx.version_converter, checks it with
onnx.checker, and writes DST/models/<family>_opset<TO>conv with its config.pbtxt and a copy of
the source's reference (the converter keeps the weights and the math, so ONNX Runtime's
outputs of the source are the references). Then:

    scripts/onnx-zoo-check DST --server build/apps/caf-serving/caf-serving

Needs the onnx package (tools/requirements-onnx.txt).
"""
import argparse
import pathlib
import re
import shutil
import sys

import onnx
import onnx.version_converter


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--from-opset", type=int, default=25)
    ap.add_argument("--to-opset", type=int, default=28)
    a = ap.parse_args()
    src, dst = pathlib.Path(a.src), pathlib.Path(a.dst)
    if not (src / "models").is_dir():
        sys.exit(f"{src}/models is not a folder: give the --out folder of the zoo export")
    own = {p.name[:-len(f"_opset{a.to_opset}")] for p in (src / "models").glob(f"*_opset{a.to_opset}")}
    failed = 0
    for m in sorted((src / "models").glob(f"*_opset{a.from_opset}")):
        family = m.name[:-len(f"_opset{a.from_opset}")]
        if family in own:
            continue
        name = f"{family}_opset{a.to_opset}conv"
        try:
            model = onnx.load(str(m / "1" / "model.onnx"))
            converted = onnx.version_converter.convert_version(model, a.to_opset)
            onnx.checker.check_model(converted)
        except Exception as e:  # the converter's own refusal, reported per model
            print(f"{name}: conversion failed: {str(e).splitlines()[0][:200]}", flush=True)
            failed += 1
            continue
        out = dst / "models" / name / "1"
        out.mkdir(parents=True, exist_ok=True)
        onnx.save(converted, str(out / "model.onnx"))
        config = re.sub(r'name: "[^"]*"', f'name: "{name}"', (m / "config.pbtxt").read_text(), count=1)
        (dst / "models" / name / "config.pbtxt").write_text(config)
        shutil.copytree(src / "reference" / m.name, dst / "reference" / name, dirs_exist_ok=True)
        print(f"{name}: converted to opset {a.to_opset}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
