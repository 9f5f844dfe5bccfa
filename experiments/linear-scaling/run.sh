#!/usr/bin/env bash
# The linear-scaling study (README.md here). From the repository root:
#   bash experiments/linear-scaling/run.sh        # about 10 minutes on 2 CPU cores
set -euo pipefail
out=outputs/linear-scaling
# A constant rate (scheduler=none) isolates the effect of the global batch and its rate.
common=(trainer.accelerator=cpu scheduler=none callbacks.verbose_log.frequency=0)
python train.py "${common[@]}" hydra.run.dir=$out/B8 datamodule.batch_size=8
python train.py "${common[@]}" hydra.run.dir=$out/B32-same-lr datamodule.batch_size=32
python train.py "${common[@]}" hydra.run.dir=$out/B32-linear-warmup datamodule.batch_size=32 \
    scaling.lr=linear scaling.base_batch_size=8
python experiments/linear-scaling/plot.py $out experiments/linear-scaling
