"""Triton's own share of a streamed request: a decoupled Python model that reads the request's
TEXT and PARAMS as an entry model does and answers at once with one response of `samples` zeros
of AUDIO (the first chunk's size) and SAMPLE_RATE, then FINAL, from the thread Triton called it
on. What a request to it takes (gRPC in, the stub, the response out) is what no model served by
Triton's Python backend can go under (perf/benchkit/triton_floor.py)."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = json.loads(args["model_config"])["parameters"]
        self.audio = np.zeros(int(params["samples"]["string_value"]), dtype=np.float32)
        self.rate = np.array([int(params["sample_rate"]["string_value"])], dtype=np.int32)

    def execute(self, requests: list) -> None:
        for request in requests:
            for name in ("TEXT", "PARAMS"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    tensor.as_numpy()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("AUDIO", self.audio),
                                                    pb_utils.Tensor("SAMPLE_RATE", self.rate)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
