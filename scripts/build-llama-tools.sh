#!/usr/bin/env bash
# Build llama.cpp's own tools (llama-bench, llama-server, ggml-rpc-server) from the llama.cpp that
# llama-cpp-python 0.3.36 vendors, so anchors in benchmarks run the same kernels as localspec.
# Not a runtime dependency. Usage: scripts/build-llama-tools.sh [OUT_DIR] (default: build/llama-tools)
# Extra CMake flags come from CMAKE_ARGS, as for llama-cpp-python (e.g. -DGGML_CUDA=on).
set -euo pipefail
case "${1:-}" in -h|--help)  # usage: the comment block above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0;; esac
cd "$(dirname "$0")/.."
OUT=${1:-build/llama-tools}
VERSION=0.3.36
SRC=$OUT/src
mkdir -p "$OUT"
if [ ! -d "$SRC/vendor/llama.cpp" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps --no-binary llama-cpp-python --no-build-isolation -q -d "$tmp" "llama-cpp-python==$VERSION"
  mkdir -p "$SRC"
  tar -xzf "$tmp"/llama_cpp_python-$VERSION.tar.gz -C "$SRC" --strip-components=1
  rm -rf "$tmp"
fi
# shellcheck disable=SC2086
cmake -S "$SRC/vendor/llama.cpp" -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DGGML_RPC=ON ${CMAKE_ARGS:-} > "$OUT/cmake.log"
cmake --build "$OUT/cmake" -j "$(nproc)" --target llama-bench llama-server ggml-rpc-server
ln -sf "$(pwd)/$OUT/cmake/bin/llama-bench" "$(pwd)/$OUT/cmake/bin/llama-server" \
  "$(pwd)/$OUT/cmake/bin/ggml-rpc-server" "$OUT/"
echo "built: $OUT/llama-bench $OUT/llama-server $OUT/ggml-rpc-server"
