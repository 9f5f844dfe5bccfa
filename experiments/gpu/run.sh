#!/usr/bin/env bash
# Every GPU check of segscale in one go, on a CUDA machine, offline:
#
#   bash experiments/gpu/run.sh [OUT]        # from the repository root
#
# 1. Installs the wheels in ./.whl (experiments/gpu/collect-wheels.sh gathers them on a
#    machine with package access) into a private folder, if there are any: a GPU image
#    often has torch, Lightning and torchmetrics but not Hydra, smp or albumentations.
#    The source runs from this tree (PYTHONPATH), so the image's own torch is used,
#    whatever version pyproject pins.
# 2. The GPU test tier: pytest -m gpu over the files that hold gpu-marked tests.
# 3. measure.py: bf16-mixed, 16-mixed and 32-true steady steps of a real train.py run,
#    and bench's step against a real run's; with .baseline/src present (another
#    version's source: git archive <commit> src | tar -x -C .baseline), that version
#    is measured in the same call, for before/after tables.
# Prints the tier's summary and one table last; logs and JSON go to OUT.
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
if [ "${SKIP_MEASURE:-0}" = 1 ]; then
  measured=0
else
  python3 experiments/gpu/measure.py "$OUT/measure" "${baseline[@]}" ${MEASURE_ARGS:-} \
    2>&1 | tee "$OUT/measure.log"
  measured=$?
fi
# The test files that hold gpu-marked tests (collecting the whole suite would import
# what only the CPU suite needs, mlflow or rasterio).
# -o addopts=: one process, not pyproject's -n auto (the tier's tests share one GPU and
# time it; the image may lack pytest-xdist).
mapfile -t files < <(grep -rlE --include='*.py' 'pytest\.mark\.gpu' tests | sort)
python3 -m pytest -o addopts= -m gpu "${files[@]}" -p no:cacheprovider -q -rfEs --durations=15 \
  --junitxml="$OUT/gpu-tier.xml" ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu-tier.log"
tier=$?
echo "== measure.py exit $measured; GPU tier exit $tier"
[ -f "$OUT/measure.log" ] && sed -n '/^| source/,$p' "$OUT/measure.log"
exit $(( measured || tier ))
