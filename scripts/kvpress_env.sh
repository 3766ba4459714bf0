#!/usr/bin/env bash
# The second test environment: kvpress 0.5.5 with transformers 5.2.x (kvpress pins transformers<5.3, and
# importing kvpress patches transformers' attention functions for the whole process, so its tests never run in
# the main venv). Usage: scripts/kvpress_env.sh [VENV_DIR]   (default .venv-kvpress; idempotent, stamp-guarded)
set -euo pipefail
VENV="${1:-.venv-kvpress}"
PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STAMP="$VENV/.installed-stamp"
if [ -f "$STAMP" ] && [ "$STAMP" -nt "$ROOT/pyproject.toml" ]; then exit 0; fi
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
# `pip install` into the environment (through uv where it can be had)
install() { bash "$ROOT/scripts/venv_install.sh" "$VENV" "$@"; }
# the CPU build of torch first, pinned: kvpress's own "torch<3,>=2.3.1" would otherwise pull a CUDA build
install "torch==2.13.0"
# kvpress 0.5.5 requires pandas<3 and transformers<5.3; everything else it needs resolves against the pinned torch
install -e "$ROOT[test,models,kvpress]" "transformers>=5.2,<5.3" "torch==2.13.0"
"$VENV/bin/python" - <<'PY'
import torch, transformers, kvpress  # noqa: F401  (fail here, not in the tests, if the resolution went wrong)
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert transformers.__version__.startswith("5.2."), transformers.__version__
PY
touch "$STAMP"
