"""The target of the spawned workers in tests/properties/run/test_workers.py: a
spawned child imports its target by module and name, so it lives on sys.path (the
test prepends this folder). It reports where it runs, then does what its seed says."""

from __future__ import annotations

import json
import os
import time

import torch

from blocktable.properties.run.messages import Log, Result
from blocktable.properties.run.workers import THREAD_VARIABLES


def probe(job, send):
    send(Log(json.dumps({"env": {k: os.environ.get(k) for k in THREAD_VARIABLES}, "cores": sorted(os.sched_getaffinity(0)),
                         "threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
                         "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")})))
    if job.seed == 0:
        send(Result("pass"))
    elif job.seed == 1:
        send(Result("fail"))
    elif job.seed == 2:
        os._exit(3)
    else:
        time.sleep(120)
        send(Result("pass"))
