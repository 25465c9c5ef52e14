#!/usr/bin/env bash
# TensorRT-LLM on an NVIDIA GPU: agentstream's `trtllm` backend against NVIDIA's own `trtllm-bench`.
#
# 1. checks nvidia-smi and Python 3.12 (TensorRT-LLM ships wheels for 3.10 and 3.12; this repo needs >= 3.11);
# 2. makes a venv with PyTorch (CUDA 13.0 wheels) and TensorRT-LLM, per NVIDIA's pip instructions, plus this
#    repo (`pip install --no-deps -e .`: the backend needs nothing else, and the service's own
#    dependencies stay out of TensorRT-LLM's pins). In an NGC TensorRT-LLM container the preinstalled
#    tensorrt_llm is reused (venv with --system-site-packages);
# 3. streams NUM_REQUESTS chat requests (CONCURRENCY at once, ~INPUT_LEN prompt tokens, exactly OUTPUT_LEN
#    generated tokens) through services.inference.backends.trtllm.TrtLlmBackend and prints one JSON line:
#    aggregate output tok/s, TTFT p50/p99, prompt tokens served from reused KV blocks;
# 4. runs `trtllm-bench throughput` on a synthetic dataset of the same shape (same request count,
#    concurrency, input/output lengths, streaming) and prints its throughput and TTFT as one JSON line;
# 5. prints one comparison line.
#
# Expected duration on one H100/H200-class GPU with the default 0.5B model: installation 5-8 min (about
# 5 GB of wheels), each of the two measured phases 1.5-3 min (download, load, warm-up, a few seconds of
# measurement); 10-14 min cold, 4-6 min with --skip-install. Every phase has a timeout, and trtllm-bench is
# skipped when less than BENCH_MIN_LEFT_S of TOTAL_BUDGET_S remains, so the script fits a 15-min session.
# CI does not run this script; it needs a GPU, internet access (PyPI, download.pytorch.org,
# pypi.nvidia.com, Hugging Face) and, outside NGC containers, libopenmpi (apt-get install libopenmpi-dev).
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"      # any HF chat model TensorRT-LLM's PyTorch backend supports
PYTHON="${PYTHON:-python3.12}"
VENV="${VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/agentstream/venv-gpu}"   # outside the repo: nothing to commit
OUT_DIR="${OUT_DIR:-${TMPDIR:-/tmp}/agentstream-gpu-check}"
NUM_REQUESTS="${NUM_REQUESTS:-256}"
CONCURRENCY="${CONCURRENCY:-64}"                  # = the backend's slots = trtllm-bench --max_batch_size/--concurrency
INPUT_LEN="${INPUT_LEN:-256}"
OUTPUT_LEN="${OUTPUT_LEN:-128}"
KV_FRACTION="${KV_FRACTION:-0.85}"
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cu130}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.9.1 torchvision}"
TRTLLM_SPEC="${TRTLLM_SPEC:-tensorrt_llm}"
TRTLLM_EXTRA_INDEX="${TRTLLM_EXTRA_INDEX:-https://pypi.nvidia.com}"
TOTAL_BUDGET_S="${TOTAL_BUDGET_S:-870}"
INSTALL_TIMEOUT_S="${INSTALL_TIMEOUT_S:-540}"
PHASE_TIMEOUT_S="${PHASE_TIMEOUT_S:-300}"
BENCH_MIN_LEFT_S="${BENCH_MIN_LEFT_S:-150}"
SKIP_INSTALL=0

usage() {
  cat <<EOF
usage: bench/gpu_check.sh [--skip-install] [--quick] [--model HF_ID] [--help]

Runs agentstream's TensorRT-LLM backend and trtllm-bench on the same synthetic workload, on this
machine's NVIDIA GPU, and prints three JSON lines (agentstream, trtllm-bench, comparison).

  --skip-install   reuse the venv \$VENV as it is (a second run)
  --quick          64 requests at concurrency 32
  --model HF_ID    the model (default \$MODEL=$MODEL)

Environment (defaults): MODEL, PYTHON=$PYTHON, VENV=$VENV, OUT_DIR=$OUT_DIR,
NUM_REQUESTS=$NUM_REQUESTS, CONCURRENCY=$CONCURRENCY, INPUT_LEN=$INPUT_LEN, OUTPUT_LEN=$OUTPUT_LEN,
KV_FRACTION=$KV_FRACTION, TORCH_INDEX, TORCH_SPEC, TRTLLM_SPEC, TOTAL_BUDGET_S=$TOTAL_BUDGET_S,
INSTALL_TIMEOUT_S=$INSTALL_TIMEOUT_S, PHASE_TIMEOUT_S=$PHASE_TIMEOUT_S, HF_TOKEN (gated models only).
Expected duration: 10-14 min cold, 4-6 min with --skip-install (see the header of this file).
EOF
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --skip-install) SKIP_INSTALL=1 ;;
    --quick) NUM_REQUESTS=64; CONCURRENCY=32 ;;
    --model) MODEL="$2"; shift ;;
    *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
START=$SECONDS
log() { printf '[gpu_check %4ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
left() { echo $((TOTAL_BUDGET_S - (SECONDS - START))); }
export MODEL NUM_REQUESTS CONCURRENCY INPUT_LEN OUTPUT_LEN KV_FRACTION OUT_DIR

# --- 1. GPU and Python ---------------------------------------------------------------------------
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs an NVIDIA GPU and driver"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 \
  || die "nvidia-smi cannot talk to the driver"
if ! command -v "$PYTHON" >/dev/null; then
  command -v python3 >/dev/null && [[ "$(python3 -c 'import sys; print(sys.version_info[:2] == (3, 12))')" == True ]] \
    && PYTHON=python3 || die "Python 3.12 not found (set PYTHON=...): TensorRT-LLM wheels exist for 3.10/3.12, this repo needs >= 3.11"
fi
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' \
  || die "$PYTHON is not Python 3.12"

# --- 2. Environment -----------------------------------------------------------------------------
mkdir -p "$OUT_DIR" "$(dirname "$VENV")"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
VPY="$VENV/bin/python"
if [[ $SKIP_INSTALL == 0 ]]; then
  if "$PYTHON" -c 'import tensorrt_llm' >/dev/null 2>&1; then
    log "tensorrt_llm already importable by $PYTHON (NGC container?): reusing it"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    if ! ldconfig -p 2>/dev/null | grep -q 'libmpi\.so'; then
      if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        log "installing libopenmpi-dev"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenmpi-dev >/dev/null
      else
        die "libmpi not found: sudo apt-get -y install libopenmpi-dev (TensorRT-LLM's prerequisite)"
      fi
    fi
    "$PYTHON" -m venv "$VENV"
    log "installing PyTorch ($TORCH_SPEC from $TORCH_INDEX) and TensorRT-LLM ($TRTLLM_SPEC); this is the long part"
    # shellcheck disable=SC2086  # the specs are word lists on purpose
    timeout "$INSTALL_TIMEOUT_S" bash -c "
      set -euo pipefail
      '$VPY' -m pip install -q --upgrade pip setuptools wheel
      '$VPY' -m pip install -q $TORCH_SPEC --index-url '$TORCH_INDEX'
      '$VPY' -m pip install -q --extra-index-url '$TRTLLM_EXTRA_INDEX' $TRTLLM_SPEC
    " || die "installation failed or took more than ${INSTALL_TIMEOUT_S}s"
  fi
  "$VPY" -m pip install -q --no-deps -e "$REPO" || die "pip install -e . failed"
fi
[[ -x "$VPY" ]] || die "no venv at $VENV (run without --skip-install first)"
TRTLLM_VERSION="$("$VPY" -c 'import tensorrt_llm; print(tensorrt_llm.__version__)' 2>/dev/null | tail -n 1)" \
  || die "tensorrt_llm does not import in $VENV"
log "TensorRT-LLM $TRTLLM_VERSION, model $MODEL, $NUM_REQUESTS requests, concurrency $CONCURRENCY, ISL~$INPUT_LEN OSL=$OUTPUT_LEN"
TRTLLM_BENCH="$VENV/bin/trtllm-bench"
command -v "$TRTLLM_BENCH" >/dev/null || TRTLLM_BENCH="$(command -v trtllm-bench || true)"

# --- 3. agentstream's backend ------------------------------------------------------------------
# A file, not `python -c`: TensorRT-LLM spawns its executor process with mpi4py, which needs the
# entry point guarded by `if __name__ == "__main__"`.
cat > "$OUT_DIR/agentstream_trtllm.py" <<'PY'
"""N chat requests through TrtLlmBackend, C at once; one JSON line on stdout."""
import asyncio
import json
import os
import random
import statistics
import time

from services.inference.backends.base import ChatMessage, Final, GenerationRequest
from services.inference.backends.trtllm import TrtLlmBackend

WORDS = ("the of and to in is was for on are with as at be by this have from or one had not but what all "
         "were when we there can an your which their said if do will each about how up out them then she "
         "many some so these would other into has more her two like him see time could no make than").split()


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else 0.0


async def main() -> None:
    model, kv = os.environ["MODEL"], float(os.environ["KV_FRACTION"])
    n, c = int(os.environ["NUM_REQUESTS"]), int(os.environ["CONCURRENCY"])
    isl, osl = int(os.environ["INPUT_LEN"]), int(os.environ["OUTPUT_LEN"])
    # ignore_eos: exactly OUTPUT_LEN tokens per request, like trtllm-bench's synthetic requests.
    backend = TrtLlmBackend(model=model, slots=c, free_gpu_memory_fraction=kv, sampling_options={"ignore_eos": True})
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
    await backend.close()
    ttfts = [t for t, _ in results]
    finals = [f for _, f in results]
    out_tokens = sum(f.completion_tokens for f in finals)
    prompt_tokens = sum(f.prompt_tokens for f in finals)
    print(json.dumps({
        "tool": "agentstream-trtllm", "model": model, "requests": n, "concurrency": c,
        "avg_input_tokens": round(prompt_tokens / n, 1), "avg_output_tokens": round(out_tokens / n, 1),
        "output_tok_s": round(out_tokens / wall, 1), "wall_s": round(wall, 2), "load_s": round(load_s, 1),
        "ttft_ms_p50": round(statistics.median(ttfts), 1), "ttft_ms_p99": round(percentile(ttfts, 0.99), 1),
        "cached_prompt_token_share": round(sum(f.cached_prompt_tokens for f in finals) / max(prompt_tokens, 1), 3),
        "finish_reasons": sorted({f.finish_reason for f in finals}),
    }))


if __name__ == "__main__":
    asyncio.run(main())
PY
log "phase 3: agentstream TrtLlmBackend (timeout ${PHASE_TIMEOUT_S}s)"
AGENTSTREAM_JSON=""
if PYTHONPATH="$REPO" timeout "$PHASE_TIMEOUT_S" "$VPY" "$OUT_DIR/agentstream_trtllm.py" \
     > "$OUT_DIR/agentstream.out" 2> "$OUT_DIR/agentstream.log"; then
  AGENTSTREAM_JSON="$(grep '^{"tool": "agentstream-trtllm"' "$OUT_DIR/agentstream.out" | tail -n 1)"
fi
if [[ -n "$AGENTSTREAM_JSON" ]]; then
  echo "$AGENTSTREAM_JSON"
else
  log "agentstream phase failed; last lines of $OUT_DIR/agentstream.log:"; tail -n 20 "$OUT_DIR/agentstream.log" >&2
fi

# --- 4. trtllm-bench on the same shape -----------------------------------------------------------
BENCH_JSON=""
if [[ -z "$TRTLLM_BENCH" ]]; then
  log "trtllm-bench not found: skipping the reference run"
elif (( $(left) < BENCH_MIN_LEFT_S )); then
  log "only $(left)s of the ${TOTAL_BUDGET_S}s budget left: skipping trtllm-bench"
else
  DATASET="$OUT_DIR/synthetic_${INPUT_LEN}_${OUTPUT_LEN}.jsonl"
  log "phase 4: trtllm-bench dataset ($NUM_REQUESTS x ISL $INPUT_LEN / OSL $OUTPUT_LEN)"
  # The prepare-dataset subcommand is in recent releases; older ones only had benchmarks/cpp/prepare_dataset.py
  # (not in the wheel), so fall back to writing the same JSON-lines format: task_id, input_ids, output_tokens.
  if ! "$TRTLLM_BENCH" --model "$MODEL" prepare-dataset --output "$DATASET" token-norm-dist \
        --num-requests "$NUM_REQUESTS" --input-mean "$INPUT_LEN" --input-stdev 0 \
        --output-mean "$OUTPUT_LEN" --output-stdev 0 > "$OUT_DIR/dataset.log" 2>&1; then
    log "prepare-dataset unavailable; generating the dataset with the model's tokenizer"
    "$VPY" - "$DATASET" <<'PY'
import json, os, random, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(os.environ["MODEL"])
rng = random.Random(420)
special = set(tok.all_special_ids)
pool = [i for i in range(tok.vocab_size) if i not in special]
with open(sys.argv[1], "w") as f:
    for i in range(int(os.environ["NUM_REQUESTS"])):
        ids = [rng.choice(pool) for _ in range(int(os.environ["INPUT_LEN"]))]
        f.write(json.dumps({"task_id": i, "input_ids": ids, "output_tokens": int(os.environ["OUTPUT_LEN"])}) + "\n")
PY
  fi
  log "phase 4: trtllm-bench throughput (timeout ${PHASE_TIMEOUT_S}s)"
  if timeout "$PHASE_TIMEOUT_S" "$TRTLLM_BENCH" --model "$MODEL" throughput --backend pytorch \
       --dataset "$DATASET" --num_requests "$NUM_REQUESTS" --warmup 2 --streaming \
       --max_batch_size "$CONCURRENCY" --concurrency "$CONCURRENCY" \
       --kv_cache_free_gpu_mem_fraction "$KV_FRACTION" --report_json "$OUT_DIR/trtllm_bench_report.json" \
       > "$OUT_DIR/trtllm_bench.log" 2>&1; then
    BENCH_JSON="$("$VPY" - "$OUT_DIR/trtllm_bench_report.json" <<'PY'
import json, os, sys
report = json.load(open(sys.argv[1]))
perf, streaming = report.get("performance", {}), report.get("streaming_metrics") or {}
ttft = streaming.get("ttft_percentiles") or {}
info = report.get("request_info", {})
print(json.dumps({
    "tool": "trtllm-bench", "model": os.environ["MODEL"], "requests": info.get("num_requests"),
    "concurrency": int(os.environ["CONCURRENCY"]), "avg_input_tokens": info.get("avg_input_length"),
    "avg_output_tokens": info.get("avg_output_length"),
    "output_tok_s": round(perf.get("system_output_throughput_tok_s", 0.0), 1),
    "ttft_ms_p50": round(ttft.get("p50", 0.0), 1), "ttft_ms_p99": round(ttft.get("p99", 0.0), 1),
}))
PY
)" || BENCH_JSON=""
  fi
  if [[ -n "$BENCH_JSON" ]]; then
    echo "$BENCH_JSON"
  else
    log "trtllm-bench failed; last lines of $OUT_DIR/trtllm_bench.log:"; tail -n 20 "$OUT_DIR/trtllm_bench.log" >&2
  fi
fi

# --- 5. Comparison ---------------------------------------------------------------------------------
"$VPY" - "$AGENTSTREAM_JSON" "$BENCH_JSON" "$TRTLLM_VERSION" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)" <<'PY'
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
log "done in $((SECONDS - START))s; logs and reports in $OUT_DIR"
[[ -n "$AGENTSTREAM_JSON" ]]
