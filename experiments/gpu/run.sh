#!/usr/bin/env bash
# Every GPU check of segscale in one go, on a CUDA machine, offline:
#
#   bash experiments/gpu/run.sh [OUT]                 # from the repository root
#   PARTS="tier" bash experiments/gpu/run.sh OUT      # some parts only (one call each)
#
# 1. Installs the wheels in ./.whl (experiments/gpu/collect-wheels.sh gathers them on a
#    machine with package access) into a private folder, if there are any: a GPU image
#    often has torch, Lightning and torchmetrics but not Hydra, smp or albumentations.
#    The source runs from this tree (PYTHONPATH), so the image's own torch is used,
#    whatever version pyproject pins.
# 2. PARTS (default "tier measure syncbn"), in that order:
#    tier     the GPU test tier: pytest -m gpu over the files that hold gpu-marked tests,
#             each test's result in OUT/gpu-tier.log as it ends;
#    measure  measure.py: bf16-mixed, 16-mixed and 32-true steady steps of a real
#             train.py run, speed=max, a one-rank DDP step against a single-device one
#             (each DDP option, profiled), and bench's step against a real run's
#             (MEASURE_ARGS="--sections ddp" for one section);
#    syncbn   experiments/sync-batchnorm/measure.py: synchronized batch norm per step,
#             two ranks sharing the GPU, bf16 and fp32, plain / GlobalBatchNorm /
#             nn.SyncBatchNorm.
#    With .baseline/src present (another version's source: git archive <commit> src |
#    tar -x -C .baseline), measure and syncbn measure that version in the same call.
# Prints the tier's summary and the tables last; logs and JSON go to OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-${OUT:-experiments/gpu/out}}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/segscale-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/segscale-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
python3 - <<'PY' | tee "$OUT/machine.txt"
import torch, lightning
print("torch", torch.__version__, "lightning", lightning.__version__,
      "GPU", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
PY
baseline=()
[ -d .baseline/src ] && baseline=(--baseline .baseline/src)
PARTS=${PARTS:-tier measure syncbn}
measured=0 tier=0 syncbn=0
if [[ " $PARTS " == *" tier "* ]]; then
  # The test files that hold gpu-marked tests (collecting the whole suite would import
  # what only the CPU suite needs, mlflow or rasterio).
  # -o addopts=: one process, not pyproject's -n auto (the tier's tests share one GPU and
  # time it; the image may lack pytest-xdist). -v: each test's result as it ends.
  mapfile -t files < <(grep -rlE --include='*.py' 'pytest\.mark\.gpu' tests | sort)
  python3 -m pytest -o addopts= -m gpu "${files[@]}" -p no:cacheprovider -v -rfEs \
    --durations=15 --junitxml="$OUT/gpu-tier.xml" ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu-tier.log"
  tier=${PIPESTATUS[0]}
fi
if [[ " $PARTS " == *" measure "* ]]; then
  python3 experiments/gpu/measure.py "$OUT/measure" "${baseline[@]}" ${MEASURE_ARGS:-} \
    2>&1 | tee "$OUT/measure.log"
  measured=${PIPESTATUS[0]}
fi
if [[ " $PARTS " == *" syncbn "* ]]; then
  sync=(experiments/sync-batchnorm/measure.py "$OUT/sync-batchnorm.json")
  if [ -d .baseline/src ]; then
    PYTHONPATH=$PWD/.baseline/src:${PYTHONPATH#$PWD/src:} python3 "${sync[@]}" --label before ${SYNCBN_ARGS:-} \
      2>&1 | tee "$OUT/sync-batchnorm.log"
  fi
  python3 "${sync[@]}" --label after ${SYNCBN_ARGS:-} 2>&1 | tee -a "$OUT/sync-batchnorm.log"
  syncbn=${PIPESTATUS[0]}
fi
echo "== parts: $PARTS; GPU tier exit $tier; measure.py exit $measured; sync-batchnorm exit $syncbn"
[ -f "$OUT/measure.log" ] && sed -n '/^| source/,$p' "$OUT/measure.log"
exit $(( tier || measured || syncbn ))
