"""Reference (oracle) outputs for Qwen3-Omni checkpoints, from transformers' ``qwen3_omni_moe``.

Run with the Omni oracle venv (see tests/oracle/omni_install.sh), never with the project's:

    .venv-omni-oracle/bin/python tests/oracle/qwen3_omni_reference.py --checkpoint DIR --jobs JOBS.json \\
        --out OUT_DIR [--threads N]

JOBS.json is a list of jobs; a job is a dict:

    {"id": "en1", "prompt": "...", "system": "...",          # or "messages": [chat messages]
     "speaker": "Ethan", "return_audio": true,
     "thinker_max_new_tokens": 64, "talker_max_new_tokens": 128, "talker_repetition_penalty": 1.05}

Only ``id`` and one of ``prompt`` / ``messages`` are required. A user message's content may hold
``{"type": "image", "image_png": PATH}`` parts (an image the processor's PIL backend reads) and
``{"type": "audio", "audio_npy": PATH}`` parts: a float32 waveform at 16 kHz saved with numpy. As the
released processor does, every recording of the chat goes through the checkpoint's
``WhisperFeatureExtractor`` in one call (``padding=True``, no truncation, attention mask), each
``<|audio_pad|>`` of the rendered text is replaced by as many as the audio encoder yields for it,
and ``input_features`` / ``feature_attention_mask`` go to ``generate``; images go through the
checkpoint's ``Qwen2VLImageProcessorPil`` (the processor's image processor without torchvision), each
``<|image_pad|>`` is replaced by ``grid.prod() / merge_size^2`` of them, and ``pixel_values`` /
``image_grid_thw`` go to ``generate``. The processor class itself
is not built (it requires torchvision, whose registry wheels do not import beside a CPU-only
torch); the steps above are its ``_process_audio`` and text replacement. Because the talker's
``get_rope_index`` reads ``config.audio_config`` (absent from the talker config) whenever a prompt
holds media, the talker config is given the thinker's audio config before generating. A plain ``prompt`` becomes
``[system?, user]`` messages with ``[{"type": "text", "text": ...}]`` content, as the released
processor's examples write them. The prompt ids come from the checkpoint's chat template through
``tokenizer.apply_chat_template(..., add_generation_prompt=True)``: for text-only chats that is
what ``processor.apply_chat_template`` yields (the processor renders the same template and only
adds media tokens, of which there are none), without the image/video/audio processors.

Decoding is greedy throughout: ``model.generate(input_ids, speaker=..., return_audio=...,
thinker_do_sample=False, talker_do_sample=False)``; the talker copies its ``do_sample`` onto the
code predictor (``_prepare_generation_config``), so the residual codebooks are greedy too. The
talker keeps the reference's other defaults (``repetition_penalty`` 1.05 unless the job says
otherwise, the top 1024 codec ids but eos suppressed); the thinker stops at ``<|im_end|>``.

OUT_DIR receives ``<id>.npz`` per job:

    input_ids   int64 [prompt_len]              the prompt
    sequences   int64 [prompt_len + generated]  the thinker's full sequence (as generate returns it)
    thinker_ids int64 [generated]               the answer's ids (``<|im_end|>`` included when emitted)
    codes       int64 [num_code_groups, frames] talker codes passed to code2wav (absent without audio)
    talker_ids  int64 [talker tokens]           the talker's codebook-0 tokens (eos included when emitted)
    waveform    float32 [samples]               code2wav output, 24 kHz (absent without audio)

and ``reference.json``: ``{"meta": {...}, "jobs": {id: {...}}}`` with, per job, the job as run
(defaults filled in), ``text`` (the answer decoded with special tokens skipped), ``prompt_text``,
``ended_with_im_end``, ``frames``, ``samples``, ``talker_ended_with_eos`` and ``seconds``; ``meta``
holds the loading info (``missing_keys``, ``unexpected_keys``, ``mismatched_keys``), versions,
``threads``, ``total_upsample`` and ``load_seconds``.
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

DEFAULTS = {"speaker": "Ethan", "return_audio": True, "thinker_max_new_tokens": 64, "talker_max_new_tokens": 128,
            "talker_repetition_penalty": 1.05}


def job_messages(job: dict) -> list[dict]:
    """The chat a job asks for: its `messages`, or its `prompt` (and `system`) as one."""
    if "messages" in job:
        return job["messages"]
    messages = []
    if job.get("system"):
        messages.append({"role": "system", "content": [{"type": "text", "text": job["system"]}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": job["prompt"]}]})
    return messages


def _loading_info(info: dict) -> dict:
    return {key: sorted(str(item) for item in info.get(key, ())) for key in
            ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}


def _media(messages: list[dict]) -> tuple[list[dict], list, list]:
    """The messages as the template sees them, and the recordings and images in order."""
    import numpy as np
    from PIL import Image

    out, recordings, images = [], [], []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.get("type") == "audio":
                    recordings.append(np.load(part["audio_npy"]).astype(np.float32))
                    parts.append({"type": "audio", "audio": f"recording {len(recordings)}"})
                elif part.get("type") == "image":
                    with Image.open(part["image_png"]) as image:
                        images.append(image.copy())
                    parts.append({"type": "image", "image": f"image {len(images)}"})
                else:
                    parts.append(part)
            content = parts
        out.append({**message, "content": content})
    return out, recordings, images


def _expand(prompt_text: str, counts: list[int], token: str) -> str:
    pieces = prompt_text.split(token)
    if len(pieces) - 1 != len(counts):
        raise SystemExit(f"{len(pieces) - 1} {token} placeholders for {len(counts)} media items")
    return pieces[0] + "".join(token * n + rest for n, rest in zip(counts, pieces[1:]))


def _run_job(model, tokenizer, job: dict, feature_extractor=None, image_processor=None) -> tuple[dict, dict]:
    import numpy as np
    import torch

    job = {**DEFAULTS, **job}
    messages, recordings, images = _media(job_messages(job))
    prompt_text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    media = {}
    if recordings:
        from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

        features = feature_extractor(recordings, sampling_rate=16000, padding=True, truncation=False,
                                     return_attention_mask=True, return_tensors="pt")
        mask = features["attention_mask"]
        counts = _get_feat_extract_output_lengths(mask.sum(-1), model.config.thinker_config.audio_config.n_window)
        prompt_text = _expand(prompt_text, [int(n) for n in counts], "<|audio_pad|>")
        media = {"input_features": features["input_features"], "feature_attention_mask": mask}
    if images:
        pixels = image_processor(images=images, return_tensors="pt")
        merge = image_processor.merge_size
        prompt_text = _expand(prompt_text, [int(g.prod()) // merge ** 2 for g in pixels["image_grid_thw"]],
                              "<|image_pad|>")
        media.update(pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"])
    input_ids = torch.tensor([tokenizer(prompt_text, add_special_tokens=False)["input_ids"]], dtype=torch.long)
    if media:
        media["attention_mask"] = torch.ones_like(input_ids)

    captured: dict = {}
    talker_generate = model.talker.generate
    chunked_decode = model.code2wav.chunked_decode

    def capture_talker(*args, **kwargs):
        result = talker_generate(*args, **kwargs)
        captured["talker_ids"] = result.sequences
        return result

    def capture_codes(codes, *args, **kwargs):
        captured["codes"] = codes.detach().clone()
        return chunked_decode(codes, *args, **kwargs)

    model.talker.generate = capture_talker
    model.code2wav.chunked_decode = capture_codes
    started = time.perf_counter()
    try:
        result = model.generate(
            input_ids=input_ids,
            speaker=job["speaker"],
            return_audio=bool(job["return_audio"]),
            thinker_max_new_tokens=int(job["thinker_max_new_tokens"]),
            talker_max_new_tokens=int(job["talker_max_new_tokens"]),
            talker_repetition_penalty=float(job["talker_repetition_penalty"]),
            thinker_do_sample=False,
            talker_do_sample=False,
            **media,
        )
    finally:
        del model.talker.generate, model.code2wav.chunked_decode
    seconds = time.perf_counter() - started

    if job["return_audio"]:
        sequences, waveform = result
    else:
        sequences, waveform = (result.sequences if hasattr(result, "sequences") else result), None
    sequences = sequences[0].to(torch.int64)
    prompt_len = input_ids.shape[1]
    thinker_ids = sequences[prompt_len:]
    im_end = model.config.im_end_token_id
    arrays = {"input_ids": input_ids[0].numpy(), "sequences": sequences.numpy(), "thinker_ids": thinker_ids.numpy()}
    summary = {
        "job": job,
        "prompt_text": prompt_text,
        "text": tokenizer.decode(thinker_ids.tolist(), skip_special_tokens=True),
        "ended_with_im_end": bool(thinker_ids.numel() and int(thinker_ids[-1]) == im_end),
        "generated": int(thinker_ids.numel()),
        "seconds": seconds,
    }
    if waveform is not None:
        codes = captured["codes"][0].to(torch.int64)
        talker_ids = captured["talker_ids"][0].to(torch.int64)
        eos = model.config.talker_config.codec_eos_token_id
        arrays.update(codes=codes.numpy(), talker_ids=talker_ids.numpy(),
                      waveform=waveform.reshape(-1).to(torch.float32).numpy().astype(np.float32))
        summary.update(frames=int(codes.shape[-1]), samples=int(arrays["waveform"].shape[0]),
                       talker_ended_with_eos=bool(talker_ids.numel() and int(talker_ids[-1]) == eos))
    return arrays, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--jobs", required=True, help="JSON file: a list of jobs")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    import transformers
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with open(args.jobs, encoding="utf-8") as handle:
        jobs = json.load(handle)
    ids = [job["id"] for job in jobs]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"job ids must be unique: {ids}")

    started = time.perf_counter()
    model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        args.checkpoint, dtype=torch.float32, output_loading_info=True)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    from transformers import WhisperFeatureExtractor

    feature_extractor = WhisperFeatureExtractor.from_pretrained(args.checkpoint)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil.from_pretrained(args.checkpoint)
    # the talker's get_rope_index reads audio_config, which only the thinker config carries
    model.talker.config.audio_config = model.config.thinker_config.audio_config
    meta = {
        "checkpoint": os.path.abspath(args.checkpoint),
        "load_seconds": time.perf_counter() - started,
        "threads": args.threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "total_upsample": int(model.code2wav.total_upsample),
        **_loading_info(info),
    }
    os.makedirs(args.out, exist_ok=True)
    summaries = {}
    for job in jobs:
        arrays, summary = _run_job(model, tokenizer, job, feature_extractor, image_processor)
        np.savez(os.path.join(args.out, f"{job['id']}.npz"), **arrays)
        summaries[job["id"]] = summary
        print(f"[omni-oracle] {job['id']}: {summary['generated']} tokens, {summary.get('frames', 0)} frames, "
              f"{summary['seconds']:.2f}s", file=sys.stderr)
    with open(os.path.join(args.out, "reference.json"), "w", encoding="utf-8") as handle:
        json.dump({"meta": meta, "jobs": summaries}, handle, indent=2, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
