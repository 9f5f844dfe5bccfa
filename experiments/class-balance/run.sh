#!/usr/bin/env bash
# Class-balanced patch sampling on the embedded synthetic data (README.md here): the
# default config trained with uniform and with class-balanced sampling (same seed, same
# 6 epochs), then both datamodules' patches/s side by side in one process. From the
# repository root:
#   bash experiments/class-balance/run.sh      # about 8 minutes on 2 idle CPU cores
set -euo pipefail
out=outputs/class-balance
common=(trainer.accelerator=cpu seed=42 callbacks.verbose_log.frequency=0)
python train.py "${common[@]}" hydra.run.dir=$out/uniform
python train.py "${common[@]}" hydra.run.dir=$out/class-balanced \
    datamodule.sampling.mode=class_balanced datamodule.sampling.p=0.5 \
    datamodule.sampling.class_weights=present
python experiments/class-balance/measure.py $out/measure.json --seconds 5 --repeats 3
python experiments/class-balance/tables.py $out > experiments/class-balance/results.md
cp $out/measure.json experiments/class-balance/measure.json
