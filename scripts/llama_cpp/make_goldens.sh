#!/usr/bin/env bash
# Rebuilds crates/decoda/tests/golden/llama_cpp_kept.jsonl from llama.cpp's own samplers.
# Needs a C++ compiler, cmake, ninja and pip (it downloads the llama-cpp-python sdist,
# which carries llama.cpp's source). `cargo test` reads the committed file instead.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
work="${WORK:-/tmp/decoda-llama-cpp}"
mkdir -p "$work"
cd "$work"
if [ ! -d src ]; then
  pip download llama-cpp-python==0.3.36 --no-binary llama-cpp-python --no-deps -d sdist
  tar xzf sdist/llama_cpp_python-0.3.36.tar.gz
  ln -sfn llama_cpp_python-0.3.36/vendor/llama.cpp src
fi
cmake -S src -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF >/dev/null
cmake --build build --target llama
g++ -O2 -std=c++17 -I src/include -I src/ggml/include -I src/src "$here/goldens.cpp" \
  build/src/libllama.a build/ggml/src/libggml.a build/ggml/src/libggml-cpu.a \
  build/ggml/src/libggml-base.a -lpthread -fopenmp -o goldens
./goldens 2>/dev/null > "$repo/crates/decoda/tests/golden/llama_cpp_kept.jsonl"
echo "wrote $(wc -l < "$repo/crates/decoda/tests/golden/llama_cpp_kept.jsonl") cases"
