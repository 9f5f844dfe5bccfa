#!/usr/bin/env bash
# The scaling study (README.md here): bench.py on the default config and at 512², each
# run measuring 1 and 2 ddp processes with synchronized batch norm on and off, and the
# model's prediction of both. From the repository root, on an otherwise idle machine:
#   bash experiments/scaling/run.sh        # about 11 minutes on 2 CPU cores
set -euo pipefail
out=outputs/scaling
python bench.py hydra.run.dir=$out/cpu-default
python bench.py datamodule.patch_size=512 datamodule.batch_size=2 bench.options=[] \
    bench.warmup_steps=2 bench.window_steps=3 bench.windows=3 hydra.run.dir=$out/cpu-512
for run in cpu-default cpu-512; do
    mkdir -p experiments/scaling/$run
    cp $out/$run/bench.json $out/$run/bench_*.png experiments/scaling/$run/
    python -c "import json, sys; from segscale.bench.report import table; print(table(json.load(open(sys.argv[1]))))" $out/$run/bench.json > experiments/scaling/$run/table.txt
done
python experiments/scaling/pairs.py experiments/scaling/cpu-default experiments/scaling/cpu-512
