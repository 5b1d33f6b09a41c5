"""Reference (oracle) voice-clone outputs for a Qwen3-TTS ``base`` checkpoint, from the official
``qwen-tts`` package. Run with the oracle venv, never with the project's:

    .venv-oracle/bin/python tests/oracle/qwen3_voice_clone_reference.py --jobs JOBS.json --out OUT.npz [--threads N]

JOBS.json: ``{"checkpoint": DIR, "audio": {"name": "file.npy", ...}, "cases": [...]}`` where a
file holds a float32 waveform at ``sample_rate`` (24000 unless the audio entry is
``{"path": ..., "sample_rate": N}``). A case:

    {"id": "icl_en", "text": "...", "audio": "name", "ref_text": "...", "x_vector_only_mode": false,
     "language": "English", "max_new_tokens": 12, "non_streaming_mode": null, "decode": true}

Each case runs the public ``generate_voice_clone`` (greedy, wrapper defaults otherwise), with the
audio passed as ``(waveform, sample_rate)``. OUT.npz holds ``codes/<id>`` (the ``generate()``
codes ``[frames, 16]``), ``ref_code/<id>`` (ICL only), ``xvector/<id>``, ``wav/<id>`` (the
wrapper's output after its cut, when decoded), ``full_wav/<id>`` (the decode of ref + new codes,
before the cut), ``encode/<name>`` (``speech_tokenizer.encode`` of each audio) and ``meta``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    from qwen_tts import Qwen3TTSModel

    if args.threads:
        torch.set_num_threads(args.threads)
    with open(args.jobs, encoding="utf-8") as handle:
        job = json.load(handle)
    tts = Qwen3TTSModel.from_pretrained(job["checkpoint"], dtype=torch.float32)
    model = tts.model
    audios = {}
    for name, entry in job["audio"].items():
        if isinstance(entry, str):
            entry = {"path": entry, "sample_rate": 24000}
        audios[name] = (np.load(entry["path"]).astype(np.float32), int(entry["sample_rate"]))

    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, object] = {"threads": torch.get_num_threads()}
    for name, (wav, sr) in audios.items():
        arrays[f"encode/{name}"] = model.speech_tokenizer.encode(wav, sr=sr).audio_codes[0].cpu().numpy().astype("int64")

    original_generate = model.generate
    original_decode = model.speech_tokenizer.decode
    for case in job["cases"]:
        captured: dict = {}

        def capture(*a, **kw):
            result = original_generate(*a, **kw)
            captured["kwargs"] = kw
            captured["codes"] = result[0]
            return result

        def decode(items):
            wavs, fs = original_decode(items)
            captured["full_wav"] = np.asarray(wavs[0], dtype=np.float32)
            return wavs, fs

        def no_decode(items):
            return [np.zeros(max(1, int(items[0]["audio_codes"].shape[0]) * 1920), dtype=np.float32)
                    for _ in items], 24000

        model.generate = capture
        model.speech_tokenizer.decode = decode if case.get("decode") else no_decode
        kwargs = {"do_sample": False, "subtalker_dosample": False}
        for key in ("repetition_penalty", "max_new_tokens"):
            if case.get(key) is not None:
                kwargs[key] = case[key]
        if case.get("non_streaming_mode") is not None:
            kwargs["non_streaming_mode"] = bool(case["non_streaming_mode"])
        try:
            started = time.perf_counter()
            wavs, _ = tts.generate_voice_clone(text=case["text"], language=case.get("language"),
                                               ref_audio=audios[case["audio"]], ref_text=case.get("ref_text"),
                                               x_vector_only_mode=bool(case.get("x_vector_only_mode", False)),
                                               **kwargs)
            meta[f"seconds/{case['id']}"] = time.perf_counter() - started
        finally:
            model.generate = original_generate
            model.speech_tokenizer.decode = original_decode
        cid = case["id"]
        kw = captured["kwargs"]
        prompt = kw["voice_clone_prompt"]
        arrays[f"codes/{cid}"] = captured["codes"][0].cpu().numpy().astype("int64")
        arrays[f"xvector/{cid}"] = prompt["ref_spk_embedding"][0].float().cpu().numpy()
        if prompt["ref_code"][0] is not None:
            arrays[f"ref_code/{cid}"] = prompt["ref_code"][0].cpu().numpy().astype("int64")
        if kw.get("ref_ids") and kw["ref_ids"][0] is not None:
            arrays[f"ref_ids/{cid}"] = kw["ref_ids"][0][0].cpu().numpy().astype("int64")
        arrays[f"input_ids/{cid}"] = kw["input_ids"][0][0].cpu().numpy().astype("int64")
        if case.get("decode"):
            arrays[f"wav/{cid}"] = np.asarray(wavs[0], dtype=np.float32)
            arrays[f"full_wav/{cid}"] = captured["full_wav"]
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(args.out, **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
