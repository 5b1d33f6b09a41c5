"""Test oracle: the reference qwen-tts 12 Hz speech tokenizer, run in .venv-oracle.

    .venv-oracle/bin/python tests/oracle/qwen3_code2wav_reference.py REQUEST.json RESULT.npz

REQUEST.json:
  {"checkpoint": dir,                      # a speech_tokenizer folder, loaded with from_pretrained
   "codes": "codes.npy",                   # int64 [B, 16, T]
   "chunked": [[chunk, left], ...],        # decoder.chunked_decode(codes, chunk, left) for each pair
   "windows": [[start, left, end], ...],   # decoder(codes[..., start:end]), first left*hop samples dropped
   "encode_seconds": 1.0,                  # optional: encode a test waveform through the wrapper
   "key_shapes_for": [config.json, ...]}   # optional: state-dict shapes of the reference module built
                                           # from these configs on the meta device (no weights)

RESULT.npz holds "full_batched" (model.decode of the whole batch, [B, T*hop]); "full",
"chunked_i" and "window_i" ([B, new*hop]) computed for each batch item alone (batch 1) and
stacked; "encoded" (codes of the test waveform); and a JSON string "info" with the loading
report and the key shapes.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model  # noqa: E402


def main(request_path: str, result_path: str) -> None:
    with open(request_path) as handle:
        request = json.load(handle)
    torch.manual_seed(0)
    info: dict = {}
    out: dict = {}

    model, loading = Qwen3TTSTokenizerV2Model.from_pretrained(request["checkpoint"], output_loading_info=True)
    model = model.float().eval()
    info["loading"] = {k: sorted(map(str, v)) for k, v in loading.items()}
    info["attn_implementation"] = model.config._attn_implementation
    hop = model.get_decode_upsample_rate()

    codes = torch.from_numpy(np.load(request["codes"])).long()
    items = [codes[i: i + 1] for i in range(codes.shape[0])]

    def per_item(decode_one):  # each batch item decoded alone (batch 1), stacked
        return torch.cat([decode_one(item) for item in items]).squeeze(1).numpy()

    with torch.inference_mode():
        full = model.decode(codes.transpose(1, 2), return_dict=True).audio_values
        out["full_batched"] = torch.stack(list(full)).numpy()
        out["full"] = per_item(lambda c: model.decode(c.transpose(1, 2), return_dict=True).audio_values[0][None])
        for i, (chunk, left) in enumerate(request.get("chunked", [])):
            out[f"chunked_{i}"] = per_item(
                lambda c: model.decoder.chunked_decode(c, chunk_size=chunk, left_context_size=left))
        for i, (start, left, end) in enumerate(request.get("windows", [])):
            out[f"window_{i}"] = per_item(lambda c: model.decoder(c[..., start:end])[..., left * hop:])

    seconds = request.get("encode_seconds")
    if seconds:
        from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

        tokenizer = Qwen3TTSTokenizer.from_pretrained(request["checkpoint"])
        t = np.arange(int(24000 * seconds)) / 24000.0
        rng = np.random.default_rng(0)
        wave = (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 1.5 * t)
                + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)
        encoded = tokenizer.encode(wave, sr=24000).audio_codes[0]
        out["encoded"] = encoded.numpy()

    shapes = {}
    for config_path in request.get("key_shapes_for", []):
        with open(config_path) as handle:
            cfg = json.load(handle)
        cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}
        with torch.device("meta"):
            ref = Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config(**cfg))
        shapes[config_path] = {k: list(v.shape) for k, v in ref.state_dict().items()}
    info["key_shapes"] = shapes

    np.savez(result_path, info=np.array(json.dumps(info)), **out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
