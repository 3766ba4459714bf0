#!/usr/bin/env bash
# `pip install ARGS...` into the virtual environment VENV, done by uv where uv can be installed there: the same
# registries and the same resolution as pip's (pip's own configuration -- its files and PIP_* variables -- is
# handed to uv), in seconds where pip takes minutes. Without uv, pip itself installs.
# Usage: scripts/venv_install.sh VENV PIP-INSTALL-ARGUMENTS...
# Environment: UV=path of a uv to use (default VENV/bin/uv, installed there by pip if missing); ATTSVM_NO_UV=1
# makes pip install.
set -euo pipefail
VENV="${1:?usage: scripts/venv_install.sh VENV PIP-INSTALL-ARGUMENTS...}"
shift
PY="$VENV/bin/python"
UV="${UV:-$VENV/bin/uv}"
if [ ! -x "$UV" ] && [ -z "${ATTSVM_NO_UV:-}" ]; then
    "$PY" -m pip install --quiet "uv>=0.9" >/dev/null 2>&1 || echo "venv_install: no uv, pip installs" >&2
fi
if [ ! -x "$UV" ] || [ -n "${ATTSVM_NO_UV:-}" ]; then
    exec "$PY" -m pip install --quiet "$@"
fi
args=()
while IFS= read -r line; do
    key="${line%%=*}"
    key="${key##*.}"
    val="${line#*=}"
    val="${val#\'}"
    val="${val%\'}"
    case "$key" in
        index-url) args+=(--index-url "$val") ;;
        extra-index-url) for v in $val; do args+=(--extra-index-url "$v"); done ;;
        find-links) for v in $val; do args+=(--find-links "$v"); done ;;
        constraint) for v in $val; do args+=(--constraint "$v"); done ;;
        cert) export SSL_CERT_FILE="$val" ;;
    esac
done < <("$PY" -m pip config list 2>/dev/null || python3 -m pip config list 2>/dev/null)
# pip takes the best version any registry offers; uv by default stops at the first registry that has the package
exec "$UV" pip install --quiet --python "$PY" --index-strategy unsafe-best-match "${args[@]}" "$@"
