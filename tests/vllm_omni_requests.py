"""What vLLM-Omni's own Qwen3-Omni example client sends (examples/online_serving/qwen3_omni):
its per-stage `sampling_params_list` (thinker, talker, code2wav), shared by the unit and system
tests of client/speech_api/stage_sampling.py."""
from __future__ import annotations

THINKER = {"temperature": 0.4, "top_p": 0.9, "top_k": 1, "max_tokens": 16384, "repetition_penalty": 1.05,
           "stop_token_ids": [151645], "seed": 42}
TALKER = {"temperature": 0.9, "top_k": 50, "max_tokens": 4096, "seed": 42, "detokenize": False,
          "repetition_penalty": 1.05, "stop_token_ids": [2150]}
CODE2WAV = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_tokens": 65536, "seed": 42, "detokenize": True,
            "repetition_penalty": 1.1}
