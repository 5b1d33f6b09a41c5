"""The random Qwen3-Omni checkpoints: released layout and ids, loaded by the reference with no
missing or unexpected weights, and reference dumps the parity tests can rely on (answers that end,
codes of the right shape, waveforms of the length code2wav yields)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.qwen3_omni_fixtures import QWEN3_OMNI_SHAPES, qwen3_omni_waveform_samples

IM_END = 151645
CODEC_EOS = 2150


def test_config_carries_the_released_ids(qwen3_omni_checkpoints):
    for shape, path in qwen3_omni_checkpoints.items():
        config = json.loads((path / "config.json").read_text())
        assert config["model_type"] == "qwen3_omni_moe"
        assert {key: config[key] for key in ("im_start_token_id", "im_end_token_id", "system_token_id",
                                              "user_token_id", "assistant_token_id", "tts_pad_token_id",
                                              "tts_bos_token_id", "tts_eos_token_id")} == {
            "im_start_token_id": 151644, "im_end_token_id": 151645, "system_token_id": 8948,
            "user_token_id": 872, "assistant_token_id": 77091, "tts_pad_token_id": 151671,
            "tts_bos_token_id": 151672, "tts_eos_token_id": 151673}
        talker = config["talker_config"]
        assert talker["speaker_id"] == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
        assert (talker["codec_pad_id"], talker["codec_bos_id"], talker["codec_eos_token_id"]) == (2148, 2149, 2150)
        assert (talker["codec_nothink_id"], talker["codec_think_bos_id"], talker["codec_think_eos_id"]) == (
            2155, 2156, 2157)
        assert talker["num_code_groups"] == 16 and talker["text_config"]["vocab_size"] == 3072
        assert talker["thinker_hidden_size"] == config["thinker_config"]["text_config"]["hidden_size"]
        text = config["thinker_config"]["text_config"]
        assert text["vocab_size"] == 152064 and text["rope_scaling"]["interleaved"] is True
        assert 2 * sum(text["rope_scaling"]["mrope_section"]) == text["head_dim"] >= 16
        code2wav = config["code2wav_config"]
        assert code2wav["upsample_rates"] == [8, 5, 4, 3] and code2wav["upsampling_ratios"] == [2, 2]


def test_shapes_differ_where_the_engine_must_follow_the_config(qwen3_omni_checkpoints):
    seen = {"layers": set(), "experts": set(), "top_k": set(), "hidden": set(), "head_dim": set(),
            "norm_topk": set(), "accept": set()}
    for path in qwen3_omni_checkpoints.values():
        config = json.loads((path / "config.json").read_text())
        text = config["thinker_config"]["text_config"]
        talker = config["talker_config"]["text_config"]
        seen["layers"].add((text["num_hidden_layers"], talker["num_hidden_layers"]))
        seen["experts"].add((text["num_experts"], talker["num_experts"]))
        seen["top_k"].add((text["num_experts_per_tok"], talker["num_experts_per_tok"]))
        seen["hidden"].add((text["hidden_size"], talker["hidden_size"]))
        seen["head_dim"].add(text["head_dim"])
        seen["norm_topk"].add(text["norm_topk_prob"])
        seen["accept"].add(config["talker_config"]["accept_hidden_layer"])
    assert all(len(values) > 1 for values in seen.values()), seen


def test_tokenizer_files_hold_the_omni_tokens_and_template(qwen3_omni_checkpoints):
    from tokenizers import Tokenizer

    path = qwen3_omni_checkpoints["tiny"]
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    for text, token_id in (("<|im_start|>", 151644), ("<|im_end|>", 151645), ("<|audio_start|>", 151669),
                           ("<|audio_end|>", 151670), ("<tts_pad>", 151671), ("<tts_text_bos>", 151672),
                           ("<tts_text_eod>", 151673), ("<tts_text_bos_single>", 151674),
                           ("<|audio_pad|>", 151675)):
        assert tokenizer.encode(text, add_special_tokens=False).ids == [token_id], text
    assert tokenizer.encode("assistant", add_special_tokens=False).ids == [77091]
    assert tokenizer.encode("user", add_special_tokens=False).ids == [872]
    assert tokenizer.encode("system", add_special_tokens=False).ids == [8948]
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert "<|im_start|>assistant\\n" in config["chat_template"]


def test_weights_use_the_released_names(qwen3_omni_checkpoints):
    from safetensors import safe_open

    with safe_open(str(qwen3_omni_checkpoints["tiny2"] / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
    for name in ("thinker.model.embed_tokens.weight", "thinker.lm_head.weight",
                 "thinker.model.layers.0.mlp.experts.5.gate_proj.weight", "thinker.model.layers.0.mlp.gate.weight",
                 "thinker.model.layers.1.mlp.down_proj.weight",          # tiny2: layer 1 is dense
                 "thinker.audio_tower.conv_out.weight", "thinker.visual.merger_list.1.mlp.2.weight",
                 "talker.model.codec_embedding.weight", "talker.codec_head.weight",
                 "talker.model.layers.2.mlp.experts.7.down_proj.weight", "talker.model.layers.0.mlp.shared_expert_gate.weight",
                 "talker.text_projection.linear_fc2.bias", "talker.hidden_projection.linear_fc1.weight",
                 "talker.code_predictor.model.codec_embedding.14.weight", "talker.code_predictor.lm_head.14.weight",
                 "code2wav.code_embedding.weight", "code2wav.upsample.1.1.gamma", "code2wav.decoder.6.conv.weight"):
        assert name in names, name
    assert not any(".gate_up_proj" in name for name in names)   # per-expert tensors, as released


def test_reference_loads_every_shape_without_missing_or_unexpected_weights(qwen3_omni_reference):
    assert set(qwen3_omni_reference) == set(QWEN3_OMNI_SHAPES)
    for shape, dump in qwen3_omni_reference.items():
        meta = dump["meta"]
        assert meta["missing_keys"] == [] and meta["unexpected_keys"] == [], (shape, meta)
        assert meta["mismatched_keys"] == [] and meta["error_msgs"] == [], (shape, meta)
        assert meta["total_upsample"] == 1920


def test_reference_dumps_are_well_formed(qwen3_omni_reference, qwen3_omni_jobs):
    for shape, dump in qwen3_omni_reference.items():
        rig = QWEN3_OMNI_SHAPES[shape]
        for spec in qwen3_omni_jobs:
            job = dump["jobs"][spec["id"]]
            where = (shape, spec["id"])
            run = job["job"]
            prompt = job["input_ids"]
            assert prompt.dtype == np.int64 and list(prompt[-3:]) == [151644, 77091, 198], where
            assert np.array_equal(job["sequences"][:len(prompt)], prompt), where
            answer = job["thinker_ids"]
            assert np.array_equal(job["sequences"][len(prompt):], answer), where
            assert not np.any(answer[:-1] == IM_END), where
            bound = run["thinker_max_new_tokens"]
            if bound < rig["thinker_eos_after"]:
                assert len(answer) == bound and not job["ended_with_im_end"], where
            else:
                assert job["ended_with_im_end"] and answer[-1] == IM_END, where
                assert len(answer) == rig["thinker_eos_after"], where
            assert job["text"].strip(), where
            if not run["return_audio"]:
                assert "codes" not in job and "waveform" not in job, where
                continue
            codes, talker_ids = job["codes"], job["talker_ids"]
            frames = codes.shape[1]
            assert codes.dtype == np.int64 and codes.shape == (16, frames), where
            assert codes.min() >= 0 and codes.max() < 2048, where
            assert np.array_equal(codes[0], talker_ids[:frames]), where
            if run["talker_max_new_tokens"] > rig["talker_eos_after"]:
                assert frames == rig["talker_eos_after"] and job["talker_ended_with_eos"], where
                assert talker_ids[-1] == CODEC_EOS, where
            else:
                assert frames == run["talker_max_new_tokens"] - 1 and not job["talker_ended_with_eos"], where
            waveform = job["waveform"]
            assert waveform.dtype == np.float32 and waveform.ndim == 1, where
            assert len(waveform) == job["samples"] == qwen3_omni_waveform_samples(frames), where
            assert np.all(np.isfinite(waveform)) and np.abs(waveform).max() <= 1.0, where
            assert 0.02 < float(np.sqrt(np.mean(waveform ** 2))) < 0.6, where     # audible, mostly unclipped
            assert np.mean(np.abs(waveform) >= 1.0) < 0.01, where


def test_reference_prompts_are_what_the_project_tokenizer_makes(qwen3_omni_reference):
    """The oracle's prompt ids are the chat template's text encoded by the checkpoint's
    tokenizer.json, which the project venv reads with ``tokenizers`` alone."""
    from tokenizers import Tokenizer

    for dump in qwen3_omni_reference.values():
        tokenizer = Tokenizer.from_file(str(dump["checkpoint"] / "tokenizer.json"))
        for job_id, job in dump["jobs"].items():
            ids = tokenizer.encode(job["prompt_text"], add_special_tokens=False).ids
            assert ids == job["input_ids"].tolist(), job_id


def test_greedy_outputs_depend_on_prompt_and_speaker(qwen3_omni_reference):
    for shape, dump in qwen3_omni_reference.items():
        jobs = dump["jobs"]
        texts = {job["text"] for job in jobs.values()}
        assert len(texts) == len(jobs), shape
        first = [job["codes"][:, :8].tobytes() for job in jobs.values() if "codes" in job]
        assert len(set(first)) == len(first), shape


@pytest.mark.parametrize("frames,samples", [(1, 1365), (32, 60885), (300, 575445), (301, 575445 + 1920 - 555)])
def test_waveform_length_rule(frames, samples):
    assert qwen3_omni_waveform_samples(frames) == samples
