"""What a CUDA graph captures must never read a device value on the host.

The unit tests run without a GPU, so the captured step functions
(:meth:`GraphSafeStaticStep.run`, the code2wav forward of :class:`Code2WavGraphs`) run on the
**meta** device, at the released 0.6B / 1.7B shapes: meta tensors have shapes but no values, so
an ``.item()``, a ``bool(tensor)``, a data-dependent shape (``nonzero``, boolean indexing) or a
stray CPU tensor inside the step raises, exactly the things that break or silently freeze a
graph capture. ``perf/gpu/check.sh`` then checks replay parity on a real GPU.
"""
from __future__ import annotations

import pytest
import torch

from omni_backend.engine.sampling import TokenRules
from omni_backend.models.qwen3_tts.code2wav import Code2Wav, Code2WavConfig
from omni_backend.models.qwen3_tts.config import Qwen3TTSConfig
from omni_backend.models.qwen3_tts.decode import Qwen3Decode
from omni_backend.models.qwen3_tts.static_step import GraphSafeStaticStep
from omni_backend.models.qwen3_tts.talker import Talker
from omni_backend.models.qwen3_tts.random_checkpoint import checkpoint_config
from omni_backend.models.qwen3_tts.random_speech_tokenizer import speech_tokenizer_config

META = torch.device("meta")


def _meta_static_step(size: str, rows: int, max_len: int) -> GraphSafeStaticStep:
    config = Qwen3TTSConfig.from_dict(checkpoint_config(size, "custom_voice"))
    with META:
        talker = Talker(config.talker).to(torch.bfloat16)
    cp = talker.code_predictor
    t = config.talker
    return GraphSafeStaticStep(Qwen3Decode(talker, cp.new_rotary(torch.bfloat16, META)),
                               talker.new_cache(rows, max_len, torch.bfloat16, META),
                               cp.new_cache(rows, torch.bfloat16, META), talker.new_rotary(torch.bfloat16, META),
                               rows, max_len,
                               TokenRules(t.vocab_size, (t.codec_eos_token_id,), t.suppressed_codec_ids, META))


def test_meta_device_rejects_host_reads():
    """The probe can fail: the things a capture cannot contain raise on meta tensors."""
    x = torch.zeros(4, device=META)
    with pytest.raises(Exception):
        x.sum().item()
    with pytest.raises(Exception):
        bool(x.max() > 0)
    with pytest.raises(Exception):
        x[x > 0]   # data-dependent shape
    with pytest.raises(Exception):
        x + torch.ones(4)   # a CPU tensor inside the step


@pytest.mark.parametrize("size", ["1.7b", "0.6b"])
def test_static_frame_step_has_no_host_sync(size):
    step = _meta_static_step(size, rows=4, max_len=64)
    # a padded bucket greedy, a full one sampling, over a length bucket and the whole slot
    for batch, sample, length in ((3, False, 32), (4, True, None)):
        step.run(batch, sample, length)
    assert step.codes.device == META and step.codes.shape == (4, 17)


def test_code2wav_windows_have_no_host_sync():
    with META:
        model = Code2Wav(Code2WavConfig.from_speech_tokenizer_config(speech_tokenizer_config("1.7b")))
    with torch.inference_mode():
        for frames, skip in ((2, 0), (97, 72)):   # the deploy schedule's first and steady windows
            codes = torch.zeros(2, model.num_quantizers, frames, dtype=torch.long, device=META)
            audio = model(codes, skip)
            assert audio.device == META and audio.shape == (2, (frames - skip) * model.hop_length)
