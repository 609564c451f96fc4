#!/bin/bash
# On a lent GPU machine, in one device call carrying .gpu (filled by ../shared/gpu/prepare.sh,
# with make_model.py's Q6_K scale a normal f16): llama-cpp-python built for CUDA, localspec on
# it, random-weight Qwen2.5 shapes (7B, 1.5B), then their cost curves and the bench: host ms
# per iteration, iteration and forward ms by batch size, and every output checked against
# plain decoding (the random weights' logits are finite and spread, so identity means
# something). Logs and JSON land in $OUT.
#   run(command="bash scripts/gpu-check.sh", carry=[".gpu"], timeout_s=590)
set -u
S=$(date +%s); el() { echo "[$(( $(date +%s) - S ))s] $*"; }
G=$PWD/.gpu; O=${OUT:-/tmp/out}; mkdir -p $O
V=/tmp/v/bin; export LOCALSPEC_HOME=/tmp/lshome PYTHONUNBUFFERED=1
exec > >(tee -a $O/log.txt) 2>&1
el start; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
python3 -m venv /tmp/v
python3 -c 'import site; print(site.getsitepackages()[0])' > $(echo /tmp/v/lib/python3*/site-packages)/base.pth
$V/pip install -q --no-index --find-links $G/whl fastapi uvicorn gguf platformdirs textual jinja2 rich diskcache 2>&1 | tail -2
mkdir -p /tmp/models /tmp/lcp && tar xzf $G/llama-cpp-python.tar.gz -C /tmp/lcp
( for m in 7b 1.5b; do $V/python $G/make_model.py $G/qwen15-skel.gguf $m /tmp/models/rand-$m.gguf; done > $O/models.log 2>&1 ) &
MODELS=$!
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .) -DGGML_RPC=on -DLLAVA_BUILD=OFF" \
  $V/pip install -v --no-index --no-build-isolation --no-deps /tmp/lcp/llama_cpp_python-* > $O/build.log 2>&1 \
  || { el "llama-cpp-python build failed"; tail -30 $O/build.log; exit 1; }
el "llama-cpp-python built"
$V/pip install -v --no-index --no-build-isolation --no-deps -e . > $O/native.log 2>&1 \
  || { el "localspec install failed"; tail -30 $O/native.log; exit 1; }
el "localspec installed"; wait $MODELS; cat $O/models.log  # (a bare wait would wait for tee too)
L=$V/localspec
$L generate -m /tmp/models/rand-7b.gguf --max-tokens 8 --drafter none "def f(x):" 2>&1 | grep -E "^localspec:|tokens/s"
B="bench --workload code-edit --limit 3 --max-tokens 256"
timeout 140 $L $B -m /tmp/models/rand-7b.gguf --drafter lookup --drafter suffix --drafter auto --json $O/bench-7b.json 2>&1 | grep -v "^bench\|warming"
el "bench 7b"
timeout 90 $L $B -m /tmp/models/rand-1.5b.gguf --drafter lookup --drafter jakiro:models/jakiro/qwen2.5-coder-1.5b-instruct.q8_0.gguf --json $O/bench-1.5b.json 2>&1 | grep -v "^bench\|warming"
el "bench 1.5b"
for f in $LOCALSPEC_HOME/cache/cost/*.json; do cp $f $O/curve-$(basename $f); done
$V/python - <<'PY'
import glob, json, os
for f in sorted(glob.glob(os.environ["LOCALSPEC_HOME"] + "/cache/cost/*.json")):
    d = json.load(open(f)); s = d["seconds"]
    print(os.path.basename(d["model"]), "ms:", round(s[0] * 1e3, 2), "x:", {n: round(s[n - 1] / s[0], 2) for n in (2, 4, 8, 16, 32, 64) if n <= len(s)},
          "discrepancy", round(d["discrepancy"], 4), "exact_batch", d["exact_batch"])
PY
timeout 45 $V/python - <<'PY'
import cProfile, pstats
from localspec.bench import workloads
from localspec.bench.runner import prompt_tokens, run_ours
from localspec.drafters.spec import DrafterSpec
from localspec.engine import Engine, EngineConfig
from localspec.sampling import SamplingConfig
engine = Engine(EngineConfig(model="/tmp/models/rand-7b.gguf", store=":memory:"))
tokens = prompt_tokens(engine, workloads.load("code-edit", 1)[0])
for spec in (DrafterSpec("suffix"), DrafterSpec.parse("auto")):
    run_ours(engine, tokens, spec, 64, SamplingConfig())
    pr = cProfile.Profile(); pr.enable()
    run_ours(engine, tokens, spec, 256, SamplingConfig())
    pr.disable(); print(spec.label); pstats.Stats(pr).sort_stats("tottime").print_stats(14)
PY
el "profile"
$V/python - <<'PY'
import json, os
for f in ("bench-7b.json", "bench-1.5b.json"):
    p = os.path.join(os.environ.get("OUT", "/tmp/out"), f)
    if not os.path.exists(p):
        continue
    for c in json.load(open(p))["configs"]:
        keep = {k: c.get(k) for k in ("name", "tokens_per_s", "speedup", "tau", "host_ms", "forward_share", "identical", "ties", "n")}
        print(f, keep)
        for k in ("host_ms_by_batch", "iteration_ms_by_batch", "forward_ms_by_batch"):
            print("   ", k, {b: round(v, 2) for b, v in list(c.get(k, {}).items())[:12]})
PY
el done
