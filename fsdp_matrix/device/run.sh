#!/usr/bin/env bash
# A prepared device run (written by `nox -s device -- --prepare DIR`; docs/pages/gpu.md):
#   bash DIR/run.sh --out OUT [--call N] [--steps A,B] [--python PY] [--budget S]   on a CUDA machine, no network
#   bash DIR/run.sh --rehearse [--all] [--out OUT]                                  here, on CPU, the image's versions
#   bash DIR/run.sh --dry-run ...                                                   print the steps, run nothing
# It installs DIR/wheels/SITE/*.whl into target folders (pip --no-index --no-deps --target), then runs the plan's
# steps with `python -m fsdp_matrix run` under each step's sites, and writes records, report.md, env.json and
# run.log into OUT (8 files at most). Everything ends within --budget seconds (default 480).
set -uo pipefail
start=$(date +%s)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$HERE
while [ "$ROOT" != / ] && ! { [ -f "$ROOT/matrix.yaml" ] && [ -f "$ROOT/fsdp_matrix/__init__.py" ]; }; do
  ROOT=$(dirname "$ROOT")
done
usage() { sed -n '2,5p' "${BASH_SOURCE[0]}" | sed 's/^# //' >&2; }
die() { echo "run.sh: $*" >&2; exit 2; }
[ "$ROOT" != / ] || die "no fsdp-matrix checkout above $HERE (DIR must live inside the repo)"
[ -f "$HERE/plan.json" ] || die "no plan.json in $HERE: run nox -s device -- --prepare DIR first"

OUT="" CALL="" STEPS="" PY="${PYTHON:-}" DEVICE=cuda BUDGET=480 SAMPLE=0 REHEARSE=0 DRY=0 ALL=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || die "--out needs a folder"; OUT=$2; shift 2 ;;
    --call) [[ "${2:-}" =~ ^[0-9]+$ ]] || die "--call needs a call number (1, 2, ...; 0: every step)"; CALL=$2; shift 2 ;;
    --steps) [ -n "${2:-}" ] || die "--steps needs step names, comma-separated"; STEPS=$2; shift 2 ;;
    --python) [ -n "${2:-}" ] || die "--python needs an interpreter"; PY=$2; shift 2 ;;
    --device) [[ "${2:-}" =~ ^(cpu|cuda)$ ]] || die "--device is cpu or cuda"; DEVICE=$2; shift 2 ;;
    --budget) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || die "--budget needs seconds"; BUDGET=$2; shift 2 ;;
    --sample) [[ "${2:-}" =~ ^[0-9]+$ ]] || die "--sample needs a cell count"; SAMPLE=$2; shift 2 ;;
    --rehearse) REHEARSE=1; shift ;;
    --all) ALL=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (bash $0 --help)" ;;
  esac
done
WORK=${FSDP_MATRIX_DEVICE_WORK:-${TMPDIR:-/tmp}/fsdp-matrix-device}
# the device has no network: a hub lookup would wait for its timeout, not fail (the cells build their models here)
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1} PYTHONUNBUFFERED=1
if [ $REHEARSE = 1 ]; then
  # the same plan on CPU, every call's steps (--call 0); 2 cells a step unless --all: the rehearsal checks wheels,
  # paths and imports, not verdicts
  DEVICE=cpu; CALL=${CALL:-0}; [ $ALL = 1 ] || [ "$SAMPLE" != 0 ] || SAMPLE=2
  OUT=${OUT:-$ROOT/results/device-rehearsal}; WORK=$ROOT/.nox/device-rehearsal-work
  VENV=$ROOT/.nox/device-rehearsal
  if [ -z "$PY" ] && [ $DRY = 0 ]; then
    HOST=${FSDP_MATRIX_HOST_PYTHON:-}
    for h in "$ROOT/.nox/device/bin/python" "$ROOT/.nox/tests-old/bin/python"; do
      [ -n "$HOST" ] || { [ -x "$h" ] && HOST=$h; }
    done
    [ -n "$HOST" ] || die "no Python with the harness to build the rehearsal venv: run nox -s device first"
    echo "[run.sh] rehearsal venv $VENV (elapsed $(( $(date +%s) - start ))s)"
    (cd "$ROOT" && PYTHONPATH="$ROOT" "$HOST" -m fsdp_matrix.device.rehearse "$VENV" "$HERE/wheels") || exit 1
    PY=$VENV/bin/python
  fi
fi
PY=${PY:-python3} CALL=${CALL:-1}
[ -n "$OUT" ] || die "--out is required (the folder the records, report and log go to)"
mkdir -p "$OUT" "$WORK" || die "cannot create $OUT or $WORK"
TEE=""
[ $DRY = 1 ] || { rm -rf "$WORK/results" "$WORK/report" "$WORK/platform-facts.json"; exec > >(tee -a "$OUT/run.log") 2>&1; TEE=$!; }
echo "[run.sh] $(date -u +%FT%TZ) plan $HERE/plan.json, device $DEVICE, python $PY, budget ${BUDGET}s"

install() {  # site folder -> $WORK/sites/SITE, with no network
  local site=$1 target=$WORK/sites/$1
  rm -rf "$target"
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$HERE/wheels/$site"/*.whl
  else  # a venv made by uv has no pip
    uv pip install -q --python "$PY" --no-index --no-deps --no-cache --target "$target" "$HERE/wheels/$site"/*.whl
  fi
}
sites=()
for d in "$HERE"/wheels/*/; do [ -d "$d" ] && sites+=("$(basename "$d")"); done
if [ $DRY = 0 ]; then
  k=0
  for site in "${sites[@]}"; do
    k=$((k + 1))
    n=$(find "$HERE/wheels/$site" -maxdepth 1 -name '*.whl' | wc -l)
    echo "[run.sh install $k/${#sites[@]}] site $site: $n wheel(s) (elapsed $(( $(date +%s) - start ))s)"
    [ "$n" = 0 ] || install "$site" || { echo "[run.sh] installing site $site failed"; exit 1; }
  done
fi
left=$(( start + BUDGET - $(date +%s) ))
[ $left -gt 30 ] || die "no time left after installing (budget ${BUDGET}s)"
cd "$ROOT" || exit 1
PYTHONPATH="$WORK/sites/harness${PYTHONPATH:+:$PYTHONPATH}" timeout --kill-after=10 "$left" "$PY" -m fsdp_matrix.device.execute \
  --plan "$HERE/plan.json" --out "$OUT" --work "$WORK" --call "$CALL" ${STEPS:+--steps "$STEPS"} --device "$DEVICE" \
  --started "$start" --deadline $(( start + BUDGET )) --sample "$SAMPLE" $([ $DRY = 1 ] && echo --dry-run)
rc=$?
echo "[run.sh] exit $rc after $(( $(date +%s) - start ))s"
# the log's last lines: let tee write them before the device tool collects OUT (it ends what a command leaves running)
[ -z "$TEE" ] || { exec >&- 2>&-; wait "$TEE" 2>/dev/null; }
exit $rc
