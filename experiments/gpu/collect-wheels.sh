#!/usr/bin/env bash
# Gather, on a machine with package access, the wheels that experiments/gpu/run.sh
# installs on an offline GPU machine: the packages segscale needs that a CUDA image
# with torch, Lightning and torchmetrics usually lacks, at the versions of this
# checkout's virtual environment, for Python 3.12 on x86-64 (change PYVER for another).
#
#   bash experiments/gpu/collect-wheels.sh [path/to/venv/python]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${1:-.venv/bin/python}
PYVER=${PYVER:-3.12}
NEEDED="hydra-core omegaconf antlr4-python3-runtime segmentation-models-pytorch
albumentations albucore stringzilla simsimd numkong pydantic pydantic-core
annotated-types typing-inspection typing-extensions optuna alembic colorlog
sqlalchemy mako"
mkdir -p .whl
freeze=$("$PY" -m pip freeze)
for name in $NEEDED; do
  pin=$(echo "$freeze" | tr '_' '-' | awk -F'==' -v n="$name" 'tolower($1)==n {print $1"=="$2}')
  [ -z "$pin" ] && continue   # not installed here: not needed by this version
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$pin" 2>/dev/null \
    || python3 -m pip wheel -q --no-deps -w .whl "$pin"   # a pure-Python sdist only
  echo "wheel: $pin"
done
du -sh .whl
