#!/bin/bash
# After ../shared/gpu/prepare.sh: adds llama-server's source (tools/server, tools/ui and
# scripts/ui-assets.cmake of the llama.cpp that llama-cpp-python vendors, from
# scripts/build-llama-tools.sh's download) to .gpu, with a tools/CMakeLists.txt that builds it alone, so that scripts/gpu-check.sh builds it in the
# same CMake run as llama-cpp-python (the CUDA kernels compiled once) for llama.cpp's own loop.
set -euo pipefail
cd "$(dirname "$0")/.."
L=build/llama-tools/src/vendor/llama.cpp; T=$L/tools
[ -d $T/server ] || { echo "$T/server is missing: run scripts/build-llama-tools.sh first"; exit 1; }
[ -d .gpu ] || { echo ".gpu is missing: run ../shared/gpu/prepare.sh first"; exit 1; }
D=$(mktemp -d); mkdir -p $D/tools $D/scripts; cp -r $T/server $T/ui $D/tools/; cp $L/scripts/ui-assets.cmake $D/scripts/
cat > $D/tools/CMakeLists.txt <<'CMAKE'
# (scripts/gpu-server-src.sh: llama-server alone)
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(mtmd)  # (the server links it)
add_subdirectory(ui)
add_subdirectory(server)
CMAKE
tar czf .gpu/server-src.tar.gz -C $D . && rm -rf $D
du -h .gpu/server-src.tar.gz
