#!/usr/bin/env bash
# Classifies a random 224x224 "image" with the example ResNet and prints the top 3
# classes as KServe classification strings ("score:index:label").
# usage: examples/requests/resnet_small.sh [HOST:PORT]
set -euo pipefail
python3 -c '
import json, random
random.seed(7)
print(json.dumps({
  "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 224, 224],
              "data": [round(random.gauss(0, 1), 4) for _ in range(3 * 224 * 224)]}],
  "outputs": [{"name": "logits", "parameters": {"classification": 3}}]}))' |
  curl -s -X POST "${1:-localhost:8000}/v2/models/resnet_small/infer" -H 'Content-Type: application/json' -d @-
echo
