"""Triton's floor for a streamed request: a tritonserver serving only `triton_floor`
(perf/benchkit/triton_floor_model.py), a model that answers each request at once with the first
chunk's audio. Its first audio, timed by the same client as a pipeline's, is the part of served
first audio that Triton itself takes and no change to a pipeline can remove."""
from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from client.triton_process import TritonProcess

MODEL = "triton_floor"
_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] optional: true }}
]
output [
  {{ name: "AUDIO" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "SAMPLE_RATE" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "samples" value: {{ string_value: "{samples}" }} }}
parameters {{ key: "sample_rate" value: {{ string_value: "{sample_rate}" }} }}
"""


def floor_repository(root: Path, samples: int, sample_rate: int) -> Path:
    """A model repository holding only the floor model, answering with `samples` samples."""
    model = root / MODEL
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(_CONFIG.format(name=MODEL, samples=samples, sample_rate=sample_rate))
    shutil.copy(Path(__file__).with_name("triton_floor_model.py"), model / "1" / "model.py")
    return root


@contextmanager
def floor_server(work: Path, samples: int, sample_rate: int) -> Iterator[TritonProcess]:
    """A tritonserver on the floor repository, for the block."""
    server = TritonProcess(floor_repository(work / "triton-floor", samples, sample_rate),
                           log_path=work / "triton-floor.log")
    try:
        yield server.start()
    finally:
        server.stop()
