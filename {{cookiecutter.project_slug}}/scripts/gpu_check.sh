#!/bin/bash
# Throughput of the default project on one CUDA GPU at 32-true, 16-mixed and bf16-mixed.
# Exits 0 with a message on a machine without a CUDA GPU. PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
"${PYTHON:-python}" scripts/gpu_check.py "$@"
