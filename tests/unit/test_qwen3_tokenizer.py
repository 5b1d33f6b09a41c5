"""Our Qwen BPE tokenizer gives the reference processor's ids (both of its regex regimes), and
the vocab.json + merges.txt fallback gives the same ids as tokenizer.json."""
from __future__ import annotations

import json
import shutil

import pytest

from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer, uses_patched_split
from tests.qwen3_fixtures import QWEN3_TOKENIZER_TEXTS


@pytest.mark.parametrize("config, patched", [
    (None, False),                                                   # no config.json
    ({"model_type": "qwen3_tts", "transformers_version": "4.57.3"}, True),
    ({"model_type": "qwen3_tts"}, True),                             # no version recorded
    ({"model_type": "qwen3_tts", "transformers_version": "4.57.2"}, False),
    ({"model_type": "qwen3_tts", "transformers_version": "4.40.0"}, False),
    ({"model_type": "mistral", "transformers_version": "4.40.0"}, True),
    ({"transformers_version": "4.40.0"}, True),                      # no model_type
    ({"model_type": "qwen3_tts", "transformers_version": "5.0.0"}, False),
    ({"model_type": "qwen3_tts", "transformers_version": "4.99.1"}, True),
])
def test_patched_split_rule(config, patched):
    assert uses_patched_split(config) is patched


@pytest.mark.oracle
def test_ids_equal_reference_in_both_regimes(qwen3_reference, qwen3_tiny_cv):
    jobs = qwen3_reference["jobs"]
    for index, job in enumerate(jobs):
        if not job.get("tokenize"):
            continue
        tokenizer = QwenTextTokenizer(job["checkpoint"])
        assert tokenizer.patched_split is (job["name"] != "unpatched_tokenizer")
        for i, text in enumerate(job["tokenize"]):
            assert tokenizer.encode(text) == qwen3_reference[f"tokens/{index}/{i}"].tolist(), (job["name"], text)


def test_regimes_differ_on_case_changes(qwen3_tiny_cv):
    patched = QwenTextTokenizer(str(qwen3_tiny_cv))
    config = json.loads((qwen3_tiny_cv / "config.json").read_text())
    config["transformers_version"] = "4.57.1"
    plain = QwenTextTokenizer(str(qwen3_tiny_cv), config)
    assert patched.patched_split and not plain.patched_split
    assert patched.encode("iPhone XMLHttpRequest") == [72, 6939, 11874, 2905, 1900]
    assert plain.encode("iPhone XMLHttpRequest") == [44740, 45838]


def test_vocab_and_merges_fallback_matches_tokenizer_json(qwen3_tiny_cv, tmp_path):
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "config.json"):
        shutil.copyfile(qwen3_tiny_cv / name, tmp_path / name)
    slow = QwenTextTokenizer(str(tmp_path))
    fast = QwenTextTokenizer(str(qwen3_tiny_cv))
    for text in QWEN3_TOKENIZER_TEXTS:
        assert slow.encode(text) == fast.encode(text), text


def test_missing_tokenizer_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        QwenTextTokenizer(str(tmp_path))
