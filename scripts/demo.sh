#!/usr/bin/env bash
# Serve the embedded default model (SmolLM2-135M-Instruct) on the CPU backend: the Q4_1
# blocks of its GGUF as they are, through ggml (`--weight-dtype gguf`, docs/cpu-kernels.md).
# Installs uv if missing, syncs the locked workspace, exports the demo core once into
# ${XDG_CACHE_HOME:-~/.cache}/helios/demo/, then runs `helios-serve --demo`.
# Extra arguments go to helios-serve (e.g. --port 8001).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if command -v uv >/dev/null 2>&1; then
    UV=(uv)
else
    python3 -m pip install --quiet uv \
        || python3 -m pip install --quiet --user uv \
        || python3 -m pip install --quiet --user --break-system-packages uv
    UV=(python3 -m uv)
fi
"${UV[@]}" sync --locked --quiet
exec "${UV[@]}" run --locked helios-serve --demo "$@"
