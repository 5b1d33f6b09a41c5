"""Where served time to first audio goes beyond the in-process path (Qwen3-TTS, c = 1).

First audio is the talker's first `initial_chunk_frames` frames, then the codec's first window.
Each part is timed three ways on the same checkpoint and deploy, one request at a time:

* in-process: the engine to its first chunk's frames, the decoder on that window;
* each stage alone through Triton (gRPC to the stage model itself: the talker's stream until it
  has sent those frames; one code2wav call on that window);
* the pipeline through Triton (client -> entry -> talker BLS stream -> codec BLS call -> client).

So `talker served - in-process` is the talker hop (gRPC, Triton, the stage's stub and event
loop), `code2wav served - in-process` the codec hop (gRPC, Triton's dynamic batcher with its
queue delay, the batch worker), and `pipeline - talker served - code2wav served` what the entry
adds (its stub, its BLS calls to each stage, pulling the talker's stream, the response to the
client). Run by perf/bench.py (`--breakdown`) while its server is up.

With the talker's option `code2wav: in_talker` the talker decodes its first window itself: its
stream is timed to that window's audio, so `talker hop` is its served time less the in-process
engine and decode, no code2wav call is on the path (code2wav served 0), and the entry is
`pipeline - talker served`.
"""
from __future__ import annotations

import json
import queue
import statistics
import time
import uuid
from typing import Any

import numpy as np

__all__ = ["ttfa_breakdown", "breakdown_table"]


def _talker_first_chunk_s(url: str, model: str, request: dict[str, Any], frames: int,
                          hop_length: int = 1920) -> tuple[float, np.ndarray]:
    """Seconds from sending the talker stage's request to its first `frames` frames (or, from a
    talker that decodes, their audio); the frames (none from a talker that decodes)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inputs = [grpcclient.InferInput("REQUEST", [1], "BYTES"), grpcclient.InferInput("REQUEST_ID", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([json.dumps(request).encode()], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([uuid.uuid4().hex.encode()], dtype=np.object_))
    got: list[np.ndarray] = []
    try:
        t0 = time.perf_counter()
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                raise RuntimeError(f"{model}: {error}")
            codes, audio = result.as_numpy("CODES"), result.as_numpy("AUDIO")
            if codes is not None:
                got.extend(codes.reshape(-1, codes.shape[-1]))
            if len(got) >= frames or (audio is not None and audio.size >= frames * hop_length):
                elapsed = time.perf_counter() - t0
                break
            if result.get_response().parameters["triton_final_response"].bool_param:
                raise RuntimeError(f"{model}: the stream ended after {len(got)} frames")
        # the rest of the stream is read to its end, so the next request starts on an idle stage
        while not result.get_response().parameters["triton_final_response"].bool_param:
            result, error = results.get(timeout=120)
            if error is not None:
                raise RuntimeError(f"{model}: {error}")
    finally:
        client.stop_stream()
        client.close()
    return elapsed, np.asarray(got[:frames], dtype=np.int64)


def _codec_call_s(url: str, model: str, window: np.ndarray) -> float:
    """Seconds of one code2wav call on `window` ([frames, codebooks], no left context)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    codes = grpcclient.InferInput("CODES", [1, window.shape[1], window.shape[0]], "INT64")
    codes.set_data_from_numpy(np.ascontiguousarray(window.T[None]))
    left = grpcclient.InferInput("LEFT_CONTEXT", [1, 1], "INT32")
    left.set_data_from_numpy(np.zeros((1, 1), dtype=np.int32))
    try:
        t0 = time.perf_counter()
        client.infer(model, [codes, left])
        return time.perf_counter() - t0
    finally:
        client.close()


class _InProcess:
    """The engine and the decoder of the served deploy, in this process."""

    def __init__(self, model_dir: str, deploy_path: str, request: dict[str, Any]):
        import dataclasses

        import torch

        from omni_backend.deploy import load_deploy
        from omni_backend.models.qwen3_tts.code2wav import Code2Wav
        from omni_backend.models.qwen3_tts.runner import create_engine
        from omni_backend.models.qwen3_tts.sampling_params import sampling_params_from_request

        deploy = load_deploy(deploy_path)
        s0, s1 = deploy.stage(0), deploy.stage(1)
        self.engine = create_engine(model_dir, max_num_seqs=s0.max_num_seqs, max_model_len=s0.max_model_len,
                                    num_threads=s0.threads, dtype=s0.dtype, device=s0.device,
                                    cuda_graph_sizes=s0.cuda_graph_sizes, enforce_eager=s0.enforce_eager,
                                    batch_invariant=s0.batch_invariant,
                                    max_prefills_per_step=s0.max_prefills_per_step)
        self.decoder = Code2Wav.from_checkpoint(f"{model_dir}/speech_tokenizer", device=s1.device)
        self.decoder.batch_invariant = s1.batch_invariant
        defaults = dataclasses.replace(self.engine.default_params, **s0.default_sampling_params)
        self.params = sampling_params_from_request(defaults, request)
        self.request = request
        self.builder = self.engine.runner.checkpoint.prompt_builder()
        self.prompt = self.build_prompt()
        self.torch = torch
        self.rounds = 0

    def build_prompt(self):
        request = self.request
        return self.builder.build(request["text"], speaker=request.get("voice"), language=request.get("language"),
                                  instruct=request.get("instructions"),
                                  non_streaming_mode=request.get("non_streaming_mode"))

    def prompt_s(self) -> float:
        """Seconds to build the request's prompt (tokenize; what a served stage does before its
        engine, and the engine timing above leaves out)."""
        t0 = time.perf_counter()
        self.build_prompt()
        return time.perf_counter() - t0

    def first_audio_s(self, frames: int) -> tuple[float, float]:
        """Seconds of the engine to its first `frames` frames, and of the decoder on that window."""
        self.rounds += 1
        rid = f"breakdown-{self.rounds}"
        t0 = time.perf_counter()
        self.engine.add_request(rid, self.prompt, self.params)
        got: list = []
        while len(got) < frames and self.engine.has_unfinished():
            got += [ev.codes for ev in self.engine.step() if ev.request_id == rid and ev.codes is not None]
        t1 = time.perf_counter()
        self.engine.cancel(rid)
        while self.engine.has_unfinished():
            self.engine.step()
        window = self.torch.tensor(got[:frames]).T[None]
        t2 = time.perf_counter()
        self.decoder.decode_window(window, 0)
        return t1 - t0, time.perf_counter() - t2


def ttfa_breakdown(url: str, pipeline: str, model_dir: str, deploy_path: str, text: str,
                   params: dict[str, Any], rounds: int = 10) -> dict[str, float]:
    """p50 milliseconds of each part (see the module's docstring)."""
    from client.triton_stream import StreamSession
    from omni_backend.deploy import load_deploy
    from omni_backend.models.qwen3_tts.adapter import Qwen3TTSAdapter

    deploy = load_deploy(deploy_path)
    frames = deploy.async_chunk.initial_chunk_frames
    in_talker = deploy.stage(0).options.get("code2wav") in ("in_talker", "adaptive")   # alone: it decodes
    request = Qwen3TTSAdapter.from_model(model_dir).validate(text, dict(params))
    local = _InProcess(model_dir, deploy_path, request)
    talker, codec, served, engine_s, decode_s = [], [], [], [], []
    # each round times every part, one after the other, so that a host busy for a while
    # (2 shared cores) weighs on all of them alike; the first round warms up
    session = StreamSession(url)   # the pipeline's client keeps its connection, as the stages' do per request
    for k in range(rounds + 1):
        t, window = _talker_first_chunk_s(url, f"{pipeline}__talker", request, frames)
        c = 0.0 if in_talker else _codec_call_s(url, f"{pipeline}__code2wav", window)
        s = session.synthesize(pipeline, text, params).ttfa_s
        e, d = local.first_audio_s(frames)
        if k:
            talker.append(t)
            codec.append(c)
            served.append(s)
            engine_s.append(e)
            decode_s.append(d)

    session.close()

    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1000.0

    out = {"in-process engine": ms(engine_s), "in-process decode": ms(decode_s),
           "talker served": ms(talker), "code2wav served": ms(codec), "pipeline served": ms(served)}
    out["in-process"] = out["in-process engine"] + out["in-process decode"]
    out["talker hop"] = out["talker served"] - out["in-process engine"] - (out["in-process decode"] if in_talker else 0)
    out["code2wav hop"] = 0.0 if in_talker else out["code2wav served"] - out["in-process decode"]
    out["entry"] = out["pipeline served"] - out["talker served"] - out["code2wav served"]
    out["served - in-process"] = out["pipeline served"] - out["in-process"]
    return out


def breakdown_table(parts: dict[str, float]) -> str:
    rows = [("in-process: engine to the first chunk's frames", "in-process engine"),
            ("in-process: decode of the first window", "in-process decode"),
            ("in-process first audio", "in-process"),
            ("talker stage alone through Triton", "talker served"),
            ("code2wav stage alone through Triton", "code2wav served"),
            ("pipeline through Triton (served first audio)", "pipeline served"),
            ("served - in-process", "served - in-process"),
            ("of which: talker hop (talker served - in-process engine)", "talker hop"),
            ("of which: code2wav hop (code2wav served - in-process decode)", "code2wav hop"),
            ("of which: entry (pipeline - talker served - code2wav served)", "entry")]
    lines = ["| part (c = 1, p50) | ms |", "|---|---|"]
    lines += [f"| {label} | {parts[key]:.1f} |" for label, key in rows]
    return "\n".join(lines)
