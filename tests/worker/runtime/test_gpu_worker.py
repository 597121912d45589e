"""GPUWorker on a real CUDA device (skipped without one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import assert_exact
from support.servable import exact_job

from hopserve.worker.runtime import GPUWorker, make_worker

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_gpu_worker_runs_exact_and_reports_memory(servable):
    w = make_worker("cuda:0", worker_id="gpu")
    assert isinstance(w, GPUWorker) and str(w.device) == "cuda:0"
    w.load_model(servable.config())
    targets = [2, 9, 64]
    res = w.execute(exact_job(servable.store, targets))
    assert res.embeddings.dtype == np.float32
    assert_exact(torch.from_numpy(res.embeddings), servable.reference[targets], "cuda job")
    info = w.status()
    assert info.device == "cuda:0"
    assert 0 < info.memory.used <= info.memory.total
    assert info.memory.peak > 0
    w.close()
