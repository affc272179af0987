#!/usr/bin/env bash
# Create a virtualenv (default .venv) and install effrag with its LLM and test extras.
#
# llama-cpp-python has no wheel for this platform and compiles (~5 min on 2 cores).
# Its default build uses -march=native, which crashes on CPUs with AMX at run time,
# so we build a portable AVX2 binary and never reuse a cached wheel.
# GPU users: set CMAKE_ARGS="-DGGML_CUDA=on" and add the "gpu" extra.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
EXTRAS="${EXTRAS:-llm,test}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF}"
# torch is pinned (2.13.0, CPU build) in pyproject.toml; install it first so no
# other requirement can pull a CUDA build.
"$VENV/bin/pip" install --quiet "torch==2.13.0"
if [[ ",$EXTRAS," == *",llm,"* ]] && ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "building llama-cpp-python (takes ~5 minutes on 2 cores)..."
  "$VENV/bin/pip" install --quiet --no-cache-dir "llama-cpp-python==0.3.36"
fi
"$VENV/bin/pip" install --quiet -e ".[$EXTRAS]"
echo "effrag installed in $VENV"
