#!/usr/bin/env bash
# TensorRT-LLM on an NVIDIA GPU: agentstream's `trtllm` backend against NVIDIA's own `trtllm-bench`,
# offline, as one script that fits in 10 minutes (TOTAL_BUDGET_S, 570 s by default).
#
# 1. checks nvidia-smi and Python (TensorRT-LLM wheels are built for 3.10 and 3.12; this repo needs >= 3.11);
# 2. an environment without the network: where $PYTHON already imports tensorrt_llm (NGC containers) an
#    environment that sees its packages; else one installed from WHEELHOUSE (a directory of wheels: torch,
#    tensorrt_llm and their dependencies, downloaded beforehand, see docs/gpu.md) with --no-index. The
#    environment comes from `virtualenv`, else `venv --without-pip` (ensurepip is missing from some NVIDIA
#    images) with the system's pip driving it (`pip --python`). This repo is installed as a plain path
#    install (--no-build-isolation --no-deps: no setuptools download, no editable hook); where the
#    environment's setuptools cannot build it, the checkout is put on PYTHONPATH instead (the backend needs
#    nothing else);
# 3. streams NUM_REQUESTS chat requests (CONCURRENCY at once, ~INPUT_LEN prompt tokens, exactly OUTPUT_LEN
#    generated tokens) through TrtLlmBackend and prints one JSON line: aggregate output tok/s, TTFT p50/p99,
#    prompt tokens served from reused KV blocks (per request from TensorRT-LLM 1.1; from the engine's
#    iteration statistics on 1.0, marked so);
# 4. runs `trtllm-bench throughput` on a synthetic dataset of the same shape and prints its figures as one
#    JSON line;
# 5. prints one comparison line.
#
# Offline throughout: HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1; the model is a local directory (MODEL_PATH,
# else MODEL_NAME's snapshot in the Hugging Face cache), given to trtllm-bench as --model NAME --model_path DIR
# (with --model alone it calls snapshot_download). ALLOW_NETWORK=1 permits installing from the package
# indexes instead of WHEELHOUSE. Each phase's JSON line is read from its output whatever its exit code
# (TensorRT-LLM's MPI teardown can fail after the figures are printed), and each phase's timeout is cut to
# what is left of the budget; trtllm-bench is skipped when less than BENCH_MIN_LEFT_S remains.
# Expected duration on one H100/H200-class GPU with a 0.5B model and an environment already there: 4-6 min.
set -uo pipefail

MODEL_NAME="${MODEL_NAME:-Qwen/Qwen2.5-0.5B-Instruct}"  # the name trtllm-bench reports, and the HF cache key
MODEL_PATH="${MODEL_PATH:-}"                             # a local model directory (default: from the HF cache)
PYTHON="${PYTHON:-python3.12}"
VENV="${VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentstream/venv-gpu}"   # outside the repo: nothing to commit
OUT_DIR="${OUT_DIR:-${TMPDIR:-/tmp}/agentstream-gpu-check}"
NUM_REQUESTS="${NUM_REQUESTS:-256}"
CONCURRENCY="${CONCURRENCY:-64}"                  # = the backend's slots = trtllm-bench --max_batch_size/--concurrency
INPUT_LEN="${INPUT_LEN:-256}"
OUTPUT_LEN="${OUTPUT_LEN:-128}"
KV_FRACTION="${KV_FRACTION:-0.85}"
WHEELHOUSE="${WHEELHOUSE:-}"
ALLOW_NETWORK="${ALLOW_NETWORK:-0}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.9.1 torchvision}"
TRTLLM_SPEC="${TRTLLM_SPEC:-tensorrt-llm==1.2.1}"     # the version pyproject.toml's [gpu] extra pins
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cu130}"   # ALLOW_NETWORK=1 only
TRTLLM_EXTRA_INDEX="${TRTLLM_EXTRA_INDEX:-https://pypi.nvidia.com}"     # ALLOW_NETWORK=1 only
TOTAL_BUDGET_S="${TOTAL_BUDGET_S:-570}"
INSTALL_TIMEOUT_S="${INSTALL_TIMEOUT_S:-300}"
PHASE_TIMEOUT_S="${PHASE_TIMEOUT_S:-240}"
BENCH_MIN_LEFT_S="${BENCH_MIN_LEFT_S:-150}"
SKIP_INSTALL=0

usage() {
  cat <<EOF
usage: bench/perf/gpu_check.sh [--skip-install] [--quick] [--model NAME] [--model-path DIR] [--help]

Runs agentstream's TensorRT-LLM backend and trtllm-bench on the same synthetic workload on this machine's
NVIDIA GPU, offline, and prints three JSON lines (agentstream, trtllm-bench, comparison).

  --skip-install     reuse the environment \$VENV as it is (a second run)
  --quick            64 requests at concurrency 32
  --model NAME       the model's name (default \$MODEL_NAME=$MODEL_NAME)
  --model-path DIR   its local directory (default: NAME's snapshot in the Hugging Face cache)

Environment (defaults): MODEL_NAME, MODEL_PATH, PYTHON=$PYTHON, VENV=$VENV, OUT_DIR=$OUT_DIR,
WHEELHOUSE (wheels for an offline install), ALLOW_NETWORK=$ALLOW_NETWORK, TORCH_SPEC, TRTLLM_SPEC,
NUM_REQUESTS=$NUM_REQUESTS, CONCURRENCY=$CONCURRENCY, INPUT_LEN=$INPUT_LEN, OUTPUT_LEN=$OUTPUT_LEN,
KV_FRACTION=$KV_FRACTION, TOTAL_BUDGET_S=$TOTAL_BUDGET_S, INSTALL_TIMEOUT_S=$INSTALL_TIMEOUT_S,
PHASE_TIMEOUT_S=$PHASE_TIMEOUT_S, BENCH_MIN_LEFT_S=$BENCH_MIN_LEFT_S.
EOF
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --skip-install) SKIP_INSTALL=1 ;;
    --quick) NUM_REQUESTS=64; CONCURRENCY=32 ;;
    --model) MODEL_NAME="$2"; shift ;;
    --model-path) MODEL_PATH="$2"; shift ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO" || exit 1
START=$SECONDS
log() { printf '[gpu_check %4ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
left() { echo $((TOTAL_BUDGET_S - (SECONDS - START))); }
# A phase's timeout: its own limit, cut to what is left of the budget (10 s kept for the summary).
budget() { local cap=$1 rest; rest=$(( $(left) - 10 )); (( rest < cap )) && cap=$rest; (( cap < 1 )) && cap=1; echo "$cap"; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export NUM_REQUESTS CONCURRENCY INPUT_LEN OUTPUT_LEN KV_FRACTION OUT_DIR MODEL_NAME
mkdir -p "$OUT_DIR" "$(dirname "$VENV")" || die "cannot create $OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
: > "$OUT_DIR/results.jsonl"

# --- 1. GPU and Python ---------------------------------------------------------------------------
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs an NVIDIA GPU and driver"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 \
  || die "nvidia-smi cannot talk to the driver"
if ! command -v "$PYTHON" >/dev/null; then
  PYTHON=python3
  command -v "$PYTHON" >/dev/null || die "no Python found (set PYTHON=...)"
fi
"$PYTHON" -c 'import sys; assert sys.version_info[:2] >= (3, 11), sys.version' \
  || die "$PYTHON is older than 3.11 (agentstream needs 3.11+; TensorRT-LLM wheels exist for 3.12)"

# --- 2. Environment -----------------------------------------------------------------------------
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip)
make_env() {  # $1: --system-site-packages or nothing. No ensurepip needed.
  rm -rf "$VENV"
  if command -v virtualenv >/dev/null; then
    virtualenv -q -p "$PYTHON" "$@" "$VENV" && return 0
  fi
  if "$PYTHON" -m virtualenv --version >/dev/null 2>&1; then
    "$PYTHON" -m virtualenv -q "$@" "$VENV" && return 0
  fi
  "$PYTHON" -m venv --without-pip "$@" "$VENV" || return 1
  if ! "$VPY" -m pip --version >/dev/null 2>&1; then  # no pip inside: the system's pip drives it
    "$PYTHON" -m pip --version >/dev/null 2>&1 || { log "no pip in $VENV nor for $PYTHON"; return 1; }
    PIP=("$PYTHON" -m pip --python "$VPY")
  fi
}
if [[ -n "$WHEELHOUSE" ]]; then
  sources=(--no-index --find-links "$WHEELHOUSE")
elif [[ $ALLOW_NETWORK == 1 ]]; then
  sources=(--extra-index-url "$TORCH_INDEX" --extra-index-url "$TRTLLM_EXTRA_INDEX")
else
  sources=(--no-index)  # only what is installed already
fi
if [[ $SKIP_INSTALL == 0 ]]; then
  if "$PYTHON" -c 'import tensorrt_llm' >/dev/null 2>&1; then
    log "tensorrt_llm already importable by $PYTHON (NGC container?): an environment that sees it"
    make_env --system-site-packages || die "could not create $VENV"
  else
    ldconfig -p 2>/dev/null | grep -q 'libmpi\.so' \
      || die "libmpi not found: install libopenmpi-dev (TensorRT-LLM's prerequisite) first"
    [[ -n "$WHEELHOUSE" || $ALLOW_NETWORK == 1 ]] \
      || die "tensorrt_llm is not installed and the machine is offline: set WHEELHOUSE=DIR (docs/gpu.md), or ALLOW_NETWORK=1"
    make_env || die "could not create $VENV"
    log "installing $TORCH_SPEC and $TRTLLM_SPEC (timeout $(budget "$INSTALL_TIMEOUT_S")s)"
    # shellcheck disable=SC2086  # the specs are word lists on purpose
    timeout "$(budget "$INSTALL_TIMEOUT_S")" "${PIP[@]}" install -q "${sources[@]}" $TORCH_SPEC $TRTLLM_SPEC \
      || die "installing TensorRT-LLM failed or took too long"
  fi
  # agentstream's base dependencies (aiokafka, fastavro, ...: a client's, nothing of the GPU stack; the
  # backend imports the streaming layer's errors), then agentstream itself without build isolation or
  # dependencies; where the environment's setuptools cannot build it, the checkout goes on PYTHONPATH.
  mapfile -t BASE_DEPS < <("$VPY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
  "${PIP[@]}" install -q "${sources[@]}" "${BASE_DEPS[@]}" > "$OUT_DIR/install.log" 2>&1 \
    || die "agentstream's base dependencies (${BASE_DEPS[*]}) are missing: add their wheels to WHEELHOUSE (docs/gpu.md); see $OUT_DIR/install.log"
  if "${PIP[@]}" install -q --no-index --no-build-isolation --no-deps "$REPO" >> "$OUT_DIR/install.log" 2>&1; then
    log "agentstream installed into $VENV"
  else
    log "agentstream not buildable here (see $OUT_DIR/install.log): running it from the checkout"
  fi
fi
[[ -x "$VPY" ]] || die "no environment at $VENV (run without --skip-install first)"
# From / : in the checkout, `import agentstream` would find ./agentstream whether installed or not.
(cd / && "$VPY" -c 'import agentstream') >/dev/null 2>&1 || export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
(cd / && "$VPY" -c 'import agentstream.services.inference.backends.trtllm') \
  || die "the backend does not import in $VENV (agentstream's base dependencies missing? run without --skip-install)"
TRTLLM_VERSION="$("$VPY" -c 'import tensorrt_llm; print(tensorrt_llm.__version__)' 2>/dev/null | tail -n 1)"
[[ -n "$TRTLLM_VERSION" ]] || die "tensorrt_llm does not import in $VENV"
if [[ -z "$MODEL_PATH" ]]; then
  MODEL_PATH="$("$VPY" -c 'import os, sys; from huggingface_hub import snapshot_download
print(snapshot_download(os.environ["MODEL_NAME"], local_files_only=True))' 2>/dev/null | tail -n 1)"
fi
[[ -n "$MODEL_PATH" && -d "$MODEL_PATH" ]] \
  || die "no local copy of $MODEL_NAME: download it where there is a network (hf download $MODEL_NAME --local-dir DIR) and set MODEL_PATH=DIR"
export MODEL_PATH
log "TensorRT-LLM $TRTLLM_VERSION, $MODEL_NAME at $MODEL_PATH, $NUM_REQUESTS requests, concurrency $CONCURRENCY, ISL~$INPUT_LEN OSL=$OUTPUT_LEN"
TRTLLM_BENCH="$VENV/bin/trtllm-bench"
[[ -x "$TRTLLM_BENCH" ]] || TRTLLM_BENCH="$(command -v trtllm-bench || true)"

# json_line FILE TOOL: the last JSON line of FILE from TOOL, whatever the exit code of what wrote it.
json_line() { grep "^{\"tool\": \"$2\"" "$1" 2>/dev/null | tail -n 1; }

# --- 3. agentstream's backend ------------------------------------------------------------------
# A file, not `python -c`: TensorRT-LLM spawns its executor process with mpi4py, which needs the
# entry point guarded by `if __name__ == "__main__"`.
cat > "$OUT_DIR/agentstream_trtllm.py" <<'PY'
"""N chat requests through TrtLlmBackend, C at once; one JSON line on stdout, printed before shutdown."""
import asyncio
import json
import os
import random
import statistics
import sys
import time

from agentstream.services.inference.backends.base import ChatMessage, Final, GenerationRequest
from agentstream.services.inference.backends.trtllm import TrtLlmBackend

WORDS = ("the of and to in is was for on are with as at be by this have from or one had not but what all "
         "were when we there can an your which their said if do will each about how up out them then she "
         "many some so these would other into has more her two like him see time could no make than").split()


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else 0.0


async def main() -> None:
    path, kv = os.environ["MODEL_PATH"], float(os.environ["KV_FRACTION"])
    n, c = int(os.environ["NUM_REQUESTS"]), int(os.environ["CONCURRENCY"])
    isl, osl = int(os.environ["INPUT_LEN"]), int(os.environ["OUTPUT_LEN"])
    # ignore_eos: exactly OUTPUT_LEN tokens per request, like trtllm-bench's synthetic requests.
    backend = TrtLlmBackend(model=path, slots=c, free_gpu_memory_fraction=kv, sampling_options={"ignore_eos": True})
    started = time.perf_counter()
    await backend.start()
    load_s = time.perf_counter() - started
    gate = asyncio.Semaphore(c)

    async def one(i: int) -> tuple[float, Final]:
        rng = random.Random(i)
        request = GenerationRequest(request_id=f"r{i}", max_tokens=osl, temperature=0.0, messages=(
            ChatMessage(role="system", content="You are a helpful assistant."),
            ChatMessage(role="user", content=" ".join(rng.choice(WORDS) for _ in range(isl)))))
        async with gate:
            t0, ttft, final = time.perf_counter(), None, None
            async for item in backend.generate(request):
                if isinstance(item, Final):
                    final = item
                elif ttft is None:
                    ttft = (time.perf_counter() - t0) * 1000
            assert final is not None
            return ttft or final.ttft_ms, final

    await asyncio.gather(*(one(-1 - i) for i in range(2)))  # warm-up, as trtllm-bench --warmup 2
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t0
    ttfts = [t for t, _ in results]
    finals = [f for _, f in results]
    out_tokens = sum(f.completion_tokens for f in finals)
    prompt_tokens = sum(f.prompt_tokens for f in finals)
    cached = [f.cached_prompt_tokens for f in finals]
    if all(x is not None for x in cached):
        share, source = round(sum(cached) / max(prompt_tokens, 1), 3), "per_request"
    else:  # TensorRT-LLM 1.0: no per-request figure; the engine's counters (warm-up included), estimated
        reuse = await backend.kv_reuse()
        share = round(reuse["reused_tokens_estimate"] / max(prompt_tokens, 1), 3) if reuse else None
        source = "iteration_stats" if reuse else "unknown"
    print(json.dumps({
        "tool": "agentstream-trtllm", "model": os.environ["MODEL_NAME"], "requests": n, "concurrency": c,
        "avg_input_tokens": round(prompt_tokens / n, 1), "avg_output_tokens": round(out_tokens / n, 1),
        "output_tok_s": round(out_tokens / wall, 1), "wall_s": round(wall, 2), "load_s": round(load_s, 1),
        "ttft_ms_p50": round(statistics.median(ttfts), 1), "ttft_ms_p99": round(percentile(ttfts, 0.99), 1),
        "cached_prompt_token_share": share, "cached_source": source,
        "finish_reasons": sorted({f.finish_reason for f in finals}),
    }), flush=True)  # before shutdown: a teardown that fails or hangs cannot lose the figures
    sys.stdout.flush()
    await asyncio.wait_for(backend.close(), 60)


if __name__ == "__main__":
    asyncio.run(main())
PY
T="$(budget "$PHASE_TIMEOUT_S")"
log "phase 3: agentstream TrtLlmBackend (timeout ${T}s)"
timeout "$T" "$VPY" "$OUT_DIR/agentstream_trtllm.py" > "$OUT_DIR/agentstream.out" 2> "$OUT_DIR/agentstream.log"
rc=$?
AGENTSTREAM_JSON="$(json_line "$OUT_DIR/agentstream.out" agentstream-trtllm)"
if [[ -n "$AGENTSTREAM_JSON" ]]; then
  echo "$AGENTSTREAM_JSON" | tee -a "$OUT_DIR/results.jsonl"
  (( rc == 0 )) || log "agentstream phase exited $rc after printing its result (kept)"
else
  log "agentstream phase failed (exit $rc); last lines of $OUT_DIR/agentstream.log:"; tail -n 20 "$OUT_DIR/agentstream.log" >&2
fi

# --- 4. trtllm-bench on the same shape -----------------------------------------------------------
BENCH_JSON=""
if [[ -z "$TRTLLM_BENCH" ]]; then
  log "trtllm-bench not found: skipping the reference run"
elif (( $(left) < BENCH_MIN_LEFT_S )); then
  log "only $(left)s of the ${TOTAL_BUDGET_S}s budget left: skipping trtllm-bench"
else
  BENCH=("$TRTLLM_BENCH" --model "$MODEL_NAME" --model_path "$MODEL_PATH")
  DATASET="$OUT_DIR/synthetic_${INPUT_LEN}_${OUTPUT_LEN}.jsonl"
  rm -f "$DATASET" "$OUT_DIR/trtllm_bench_report.json"  # a previous run's must not stand in for this one's
  log "phase 4: trtllm-bench dataset ($NUM_REQUESTS x ISL $INPUT_LEN / OSL $OUTPUT_LEN)"
  # prepare-dataset is in recent releases; else the same JSON-lines format (task_id, input_ids,
  # output_tokens) is written with the model's own tokenizer.
  if ! timeout 60 "${BENCH[@]}" prepare-dataset --output "$DATASET" token-norm-dist \
        --num-requests "$NUM_REQUESTS" --input-mean "$INPUT_LEN" --input-stdev 0 \
        --output-mean "$OUTPUT_LEN" --output-stdev 0 > "$OUT_DIR/dataset.log" 2>&1 || [[ ! -s "$DATASET" ]]; then
    log "prepare-dataset unavailable; generating the dataset with the model's tokenizer"
    "$VPY" - "$DATASET" <<'PY'
import json, os, random, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(os.environ["MODEL_PATH"])
rng = random.Random(420)
special = set(tok.all_special_ids)
pool = [i for i in range(tok.vocab_size) if i not in special]
with open(sys.argv[1], "w") as f:
    for i in range(int(os.environ["NUM_REQUESTS"])):
        ids = [rng.choice(pool) for _ in range(int(os.environ["INPUT_LEN"]))]
        f.write(json.dumps({"task_id": i, "input_ids": ids, "output_tokens": int(os.environ["OUTPUT_LEN"])}) + "\n")
PY
  fi
  T="$(budget "$PHASE_TIMEOUT_S")"
  log "phase 4: trtllm-bench throughput (timeout ${T}s)"
  timeout "$T" "${BENCH[@]}" throughput --backend pytorch \
       --dataset "$DATASET" --num_requests "$NUM_REQUESTS" --warmup 2 --streaming \
       --max_batch_size "$CONCURRENCY" --concurrency "$CONCURRENCY" \
       --kv_cache_free_gpu_mem_fraction "$KV_FRACTION" --report_json "$OUT_DIR/trtllm_bench_report.json" \
       > "$OUT_DIR/trtllm_bench.log" 2>&1
  rc=$?
  if [[ -s "$OUT_DIR/trtllm_bench_report.json" ]]; then  # written before teardown: kept whatever rc says
    "$VPY" - "$OUT_DIR/trtllm_bench_report.json" > "$OUT_DIR/trtllm_bench.out" 2>>"$OUT_DIR/trtllm_bench.log" <<'PY'
import json, os, sys
report = json.load(open(sys.argv[1]))
perf, streaming = report.get("performance", {}), report.get("streaming_metrics") or {}
ttft = streaming.get("ttft_percentiles") or {}
info = report.get("request_info", {})
print(json.dumps({
    "tool": "trtllm-bench", "model": os.environ["MODEL_NAME"], "requests": info.get("num_requests"),
    "concurrency": int(os.environ["CONCURRENCY"]), "avg_input_tokens": info.get("avg_input_length"),
    "avg_output_tokens": info.get("avg_output_length"),
    "output_tok_s": round(perf.get("system_output_throughput_tok_s", 0.0), 1),
    "ttft_ms_p50": round(ttft.get("p50", 0.0), 1), "ttft_ms_p99": round(ttft.get("p99", 0.0), 1),
}))
PY
    BENCH_JSON="$(json_line "$OUT_DIR/trtllm_bench.out" trtllm-bench)"
  fi
  if [[ -n "$BENCH_JSON" ]]; then
    echo "$BENCH_JSON" | tee -a "$OUT_DIR/results.jsonl"
    (( rc == 0 )) || log "trtllm-bench exited $rc after writing its report (kept)"
  else
    log "trtllm-bench failed (exit $rc); last lines of $OUT_DIR/trtllm_bench.log:"; tail -n 20 "$OUT_DIR/trtllm_bench.log" >&2
  fi
fi

# --- 5. Comparison ---------------------------------------------------------------------------------
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
"$PYTHON" - "$AGENTSTREAM_JSON" "$BENCH_JSON" "$TRTLLM_VERSION" "$GPU" <<'PY' | tee -a "$OUT_DIR/results.jsonl"
import json, sys
ours = json.loads(sys.argv[1]) if sys.argv[1] else None
ref = json.loads(sys.argv[2]) if sys.argv[2] else None
line = {"comparison": "agentstream TrtLlmBackend vs trtllm-bench", "tensorrt_llm": sys.argv[3], "gpu": sys.argv[4]}
if ours and ref and ref["output_tok_s"]:
    line |= {"output_tok_s": [ours["output_tok_s"], ref["output_tok_s"]],
             "output_tok_s_ratio": round(ours["output_tok_s"] / ref["output_tok_s"], 3),
             "ttft_ms_p50": [ours["ttft_ms_p50"], ref["ttft_ms_p50"]],
             "ttft_ms_p99": [ours["ttft_ms_p99"], ref["ttft_ms_p99"]]}
else:
    line["missing"] = [name for name, v in (("agentstream", ours), ("trtllm-bench", ref)) if not v]
print(json.dumps(line))
PY
log "done in $((SECONDS - START))s; results in $OUT_DIR/results.jsonl, logs beside them"
[[ -n "$AGENTSTREAM_JSON" ]]
