"""A Llama config as transformers 4 writes it (``rope_theta`` + ``rope_scaling``, the released
Orpheus) and the same config re-saved by transformers 5 (one ``rope_parameters``, as a fine-tune
saved today has) read into the same settings and rotary frequencies. transformers 5 (the Qwen3-Omni
reference venv) writes the second form here."""
from __future__ import annotations

import json
import subprocess

import pytest
import torch

from omni_backend.models.orpheus.llama import LlamaConfig, rope_inv_freq
from tests.qwen3_omni_fixtures import QWEN3_OMNI_ORACLE_PYTHON, require_qwen3_omni_oracle

V4 = {"model_type": "llama", "vocab_size": 156940, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": True,
      "eos_token_id": 128009,
      "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"}}

RESAVE = """
import json, sys, tempfile
from transformers import LlamaConfig
out = tempfile.mkdtemp()
LlamaConfig(**json.loads(sys.argv[1])).save_pretrained(out)
print(open(out + "/config.json").read())
"""


def _resaved(config: dict) -> dict:
    require_qwen3_omni_oracle()
    done = subprocess.run([str(QWEN3_OMNI_ORACLE_PYTHON), "-c", RESAVE, json.dumps(config)],
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("scaled", [True, False])
def test_a_config_resaved_by_transformers_5_reads_the_same(scaled):
    v4 = dict(V4) if scaled else {k: v for k, v in V4.items() if k != "rope_scaling"}
    v5 = _resaved(v4)
    assert "rope_parameters" in v5 and "rope_theta" not in v5 and "rope_scaling" not in v5
    a, b = LlamaConfig.from_dict(v4), LlamaConfig.from_dict(v5)
    assert a.rope_theta == b.rope_theta == 500000.0
    assert (a.rope_scaling is None) == (b.rope_scaling is None) == (not scaled)
    assert torch.equal(rope_inv_freq(a), rope_inv_freq(b))
