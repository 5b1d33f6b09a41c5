"""Random checkpoints in the released layout, config parsing and strict weight loading."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

from omni_backend.models.qwen3_tts.checkpoint import load_checkpoint, read_state_dict
from omni_backend.models.qwen3_tts.config import ConfigError, GenerationDefaults, Qwen3TTSConfig
from omni_backend.models.qwen3_tts.talker import Talker
from omni_backend.models.qwen3_tts.random_checkpoint import (
    SIZES,
    _tensor_list,
    checkpoint_config,
    main,
    write_random_checkpoint,
)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_layout_and_determinism(qwen3_tiny_cv, tmp_path):
    names = {p.name for p in qwen3_tiny_cv.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "vocab.json",
            "merges.txt", "tokenizer_config.json", "speech_tokenizer"} <= names
    assert {p.name for p in (qwen3_tiny_cv / "speech_tokenizer").iterdir()} >= {
        "config.json", "preprocessor_config.json", "model.safetensors"}
    again = write_random_checkpoint(str(tmp_path / "again"), "tiny", "custom_voice", seed=0)
    for name in ("model.safetensors", "config.json", "speech_tokenizer/model.safetensors"):
        assert _sha(qwen3_tiny_cv / name) == _sha(tmp_path / "again" / name), name
    other = write_random_checkpoint(str(tmp_path / "other"), "tiny", "custom_voice", seed=1, speech_tokenizer=False)
    assert _sha(qwen3_tiny_cv / "model.safetensors") != _sha(tmp_path / "other" / "model.safetensors")
    assert again and other


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("model_type", ["custom_voice", "voice_design", "base"])
def test_tensor_names_and_shapes_match_our_modules(size, model_type):
    config = checkpoint_config(size, model_type)
    parsed = Qwen3TTSConfig.from_dict(config)
    with torch.device("meta"):
        talker = Talker(parsed.talker)
    ours = {f"talker.{k}": tuple(v.shape) for k, v in talker.state_dict().items()}
    written = {t.name: t.shape for t in _tensor_list(config) if t.name.startswith("talker.")}
    assert written == ours
    has_speaker_encoder = any(t.name.startswith("speaker_encoder.") for t in _tensor_list(config))
    assert has_speaker_encoder is (model_type == "base")
    projection = "talker.code_predictor.small_to_mtp_projection.weight" in written
    assert projection is (size in ("tiny", "tiny2", "small", "1.7b"))


def test_sizes():
    count = lambda size: sum(torch.Size(t.shape).numel() for t in _tensor_list(checkpoint_config(size, "custom_voice")))  # noqa: E731
    assert 100e6 < count("small") < 103e6
    t = checkpoint_config("1.7b", "custom_voice")["talker_config"]
    assert (t["hidden_size"], t["num_hidden_layers"], t["intermediate_size"], t["head_dim"]) == (2048, 28, 6144, 128)
    assert t["code_predictor_config"]["hidden_size"] == 1024
    t6 = checkpoint_config("0.6b", "custom_voice")["talker_config"]
    assert (t6["hidden_size"], t6["code_predictor_config"]["hidden_size"]) == (1024, 1024)
    t2 = checkpoint_config("tiny2", "custom_voice")["talker_config"]
    tiny = checkpoint_config("tiny", "custom_voice")["talker_config"]
    assert t2["num_hidden_layers"] != tiny["num_hidden_layers"]
    assert t2["code_predictor_config"]["num_hidden_layers"] != tiny["code_predictor_config"]["num_hidden_layers"]
    assert t2["hidden_size"] != t2["code_predictor_config"]["hidden_size"]


def test_load_is_strict(qwen3_tiny_cv, qwen3_loaded, tmp_path):
    ck = qwen3_loaded(qwen3_tiny_cv)
    state = read_state_dict(str(qwen3_tiny_cv), "talker.")
    for name, value in ck.talker.state_dict().items():
        assert torch.equal(value, state[name]), name
    assert ck.config.tts_model_type == "custom_voice"
    assert ck.generation.max_new_tokens == 8192 and ck.generation.repetition_penalty == 1.05
    # a config that disagrees with the weights is refused
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in qwen3_tiny_cv.iterdir():
        (broken / item.name).symlink_to(item)
    (broken / "config.json").unlink()
    config = json.loads((qwen3_tiny_cv / "config.json").read_text())
    config["talker_config"]["num_hidden_layers"] = 3
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing"):
        load_checkpoint(str(broken))
    config["talker_config"]["num_hidden_layers"] = 2
    config["talker_config"]["intermediate_size"] = 256
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="shape"):
        load_checkpoint(str(broken))


def test_bfloat16_load(qwen3_tiny_cv):
    ck = load_checkpoint(str(qwen3_tiny_cv), dtype="bfloat16")
    assert ck.dtype == torch.bfloat16


def test_config_errors():
    good = checkpoint_config("tiny", "custom_voice")
    with pytest.raises(ConfigError, match="tts_model_type"):
        Qwen3TTSConfig.from_dict({**good, "tts_model_type": "clone"})
    talker = dict(good["talker_config"])
    del talker["rope_scaling"]
    with pytest.raises(ConfigError, match="rope_scaling"):
        Qwen3TTSConfig.from_dict({**good, "talker_config": talker})
    sliding = {**good["talker_config"], "use_sliding_window": True}
    with pytest.raises(ConfigError, match="sliding"):
        Qwen3TTSConfig.from_dict({**good, "talker_config": sliding})
    assert GenerationDefaults.from_dict({}) == GenerationDefaults()
    assert GenerationDefaults.from_dict({"top_k": 7, "do_sample": False}).top_k == 7


def test_cli_and_eos_argument(tmp_path, capsys):
    assert main(["--size", "tiny", "--type", "voice_design", "--out", str(tmp_path / "vd"), "--seed", "4"]) == 0
    assert json.loads((tmp_path / "vd" / "config.json").read_text())["tts_model_type"] == "voice_design"
    with pytest.raises(ValueError, match="eos-after"):
        write_random_checkpoint(str(tmp_path / "bad"), "tiny", "custom_voice", eos_after=1, speech_tokenizer=False)


def test_text_table_stays_in_host_memory_off_cpu(qwen3_tiny_cv):
    """On an accelerator the text embedding table stays on the host (it is only read at prefill);
    the meta device stands in for the accelerator here."""
    checkpoint = load_checkpoint(str(qwen3_tiny_cv), device="meta")
    talker = checkpoint.talker
    assert talker.model.text_embedding.weight.device.type == "cpu"
    others = {p.device.type for n, p in talker.named_parameters() if n != "model.text_embedding.weight"}
    assert others == {"meta"} and checkpoint.device.type == "meta"
    out = talker.embed_text(torch.tensor([[1, 2, 3]]))
    assert out.device.type == "meta" and out.shape == (1, 3, talker.config.hidden_size)
    on_cpu = load_checkpoint(str(qwen3_tiny_cv)).talker
    ids = torch.tensor([[5, 7]])
    assert torch.equal(on_cpu.embed_text(ids), on_cpu.text_projection(on_cpu.model.text_embedding(ids)))
