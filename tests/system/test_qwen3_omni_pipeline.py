"""Qwen3-Omni served through a real tritonserver: thinker -> talker -> code2wav, streamed.

One server holds two builds of the pipeline: `qwen3_omni` on the parity checkpoint (shape
"tiny" of tests/qwen3_omni_fixtures.py; its windows reach back to the reference's segment start)
and `qwen3_omni_tiny_random` on a checkpoint whose thinker writes 160 tokens (its answer takes
long enough to watch the audio start while it writes).

* parity: every parity job, served greedy, gives the reference's answer text and its waveform
  within 1e-4, alone and with all jobs at once (each equal to its solo run bit for bit);
* streaming: text deltas come before audio, and the first audio leaves before the thinker ends;
* `return_audio: false` streams the text only; seeded sampling is isolated too;
* a client that leaves frees all three stages; bad requests get `invalid_request` naming the field;
* with the talker in the entry's process (`process: entry`, a second server) every parity job,
  alone and all at once, equals the talker-as-a-model run bit for bit, and leaving frees it;
* audio and image input: questions with recordings and images (input_audio / image_url parts in
  PARAMS `content` / `messages`) equal the reference, alone and beside text conversations; a bad
  recording or image names its part.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

from client.triton_stream import TritonStreamError, stream_parts
from tests.oracle.qwen3_omni_reference import job_messages
from tests.qwen3_omni_fixtures import QWEN3_OMNI_AUDIO_JOBS, QWEN3_OMNI_IMAGE_JOBS, audio_job_messages
from tests.served_pipeline import served

MEDIA_JOBS = QWEN3_OMNI_AUDIO_JOBS + QWEN3_OMNI_IMAGE_JOBS
from tests.system.speech_api_helpers import metric, wait_for

ROOT = Path(__file__).resolve().parents[2]
PARITY = "qwen3_omni"
LONG = "qwen3_omni_tiny_random"
LONG_ANSWER_TOKENS = 160
WAVEFORM_TOLERANCE = 1e-4
GREEDY = {"do_sample": False, "talker_do_sample": False}


def _deploy(pipeline: str, model: str, left_context: int, base: Path, talker_process: str = "own") -> Path:
    deploy = yaml.safe_load((ROOT / "deploy" / "qwen3_omni_tiny_random.yaml").read_text())
    deploy["pipeline"] = pipeline
    deploy["model"] = model
    deploy["async_chunk"]["left_context_frames"] = left_context
    deploy["stages"][0]["default_sampling_params"]["max_new_tokens"] = 512
    deploy["stages"][1]["process"] = talker_process
    path = base / f"{pipeline}.yaml"
    path.write_text(yaml.safe_dump(deploy))
    return path


def _omni_server(qwen3_omni_reference, base: Path, talker_process: str):
    from omni_backend.models.qwen3_omni.random_checkpoint import write_random_checkpoint

    long_checkpoint = write_random_checkpoint(str(base / "long"), "tiny", seed=3,
                                              thinker_eos_after=LONG_ANSWER_TOKENS, talker_eos_after=None)
    deploys = {PARITY: _deploy(PARITY, str(qwen3_omni_reference["tiny"]["checkpoint"]), 325, base, talker_process),
               LONG: _deploy(LONG, long_checkpoint, 100, base, talker_process)}
    return served(deploys, base)


@pytest.fixture(scope="module")
def omni_server(qwen3_omni_reference, tmp_path_factory):
    with _omni_server(qwen3_omni_reference, tmp_path_factory.mktemp("omni_server"), "own") as server:
        yield server


@pytest.fixture(scope="module")
def omni_talker_in_entry(qwen3_omni_reference, tmp_path_factory):
    """The talker in the entry's process (`process: entry`), fed by the thinker through the entry
    as over BLS."""
    with _omni_server(qwen3_omni_reference, tmp_path_factory.mktemp("omni_talker_in_entry"), "entry") as server:
        yield server


def _job_request(job: dict) -> tuple[str, dict]:
    """A parity job as a served request: the last user turn is TEXT, the turns before it PARAMS."""
    messages = job_messages(job)
    last = messages[-1]["content"]
    text = last if isinstance(last, str) else "".join(part["text"] for part in last)
    params = {"do_sample": False, "speaker": job["speaker"], "return_audio": bool(job["return_audio"]),
              "max_tokens": int(job["thinker_max_new_tokens"])}
    if messages[:-1]:
        params["messages"] = messages[:-1]
    if job["return_audio"]:
        params.update(talker_do_sample=False, talker_max_new_tokens=int(job["talker_max_new_tokens"]),
                      talker_repetition_penalty=float(job["talker_repetition_penalty"]))
    return text, params


class Served:
    """One streamed answer: its text deltas, audio chunks and arrival times."""

    def __init__(self, server, model: str, text: str, params: dict):
        self.deltas: list[str] = []
        self.chunks: list[np.ndarray] = []
        self.finish_reason = None
        self.order: list[tuple[str, float]] = []   # ("text" | "audio", seconds since the request)
        t0 = time.perf_counter()
        for part in stream_parts(server.grpc_url, model, text, params, timeout_s=300):
            now = time.perf_counter() - t0
            if part.audio is not None and part.audio.size:
                self.chunks.append(part.audio)
                self.order.append(("audio", now))
            delta = part.outputs.get("TEXT_DELTA")
            if delta is not None:
                self.deltas.append(delta.reshape(-1)[0].decode())
                self.order.append(("text", now))
            reason = part.outputs.get("FINISH_REASON")
            if reason is not None:
                self.finish_reason = reason.reshape(-1)[0].decode()

    @property
    def text(self) -> str:
        return "".join(self.deltas)

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)


@pytest.fixture(scope="module")
def tokenizer(qwen3_omni_reference):
    from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer

    return QwenTextTokenizer(str(qwen3_omni_reference["tiny"]["checkpoint"]))


@pytest.fixture(scope="module")
def solo(omni_server, qwen3_omni_reference):
    jobs = qwen3_omni_reference["tiny"]["jobs"]
    return {job_id: Served(omni_server, PARITY, *_job_request(ref["job"])) for job_id, ref in jobs.items()}


def test_served_answers_equal_the_reference(solo, qwen3_omni_reference, tokenizer):
    for job_id, ref in qwen3_omni_reference["tiny"]["jobs"].items():
        served = solo[job_id]
        generated = ref["sequences"].tolist()[len(ref["input_ids"]):]
        assert served.text == tokenizer.decode(generated), job_id
        assert served.finish_reason == ("stop" if ref["ended_with_im_end"] else "length"), job_id
        if not ref["job"]["return_audio"]:
            assert not served.chunks, job_id
            continue
        assert served.audio.shape == ref["waveform"].shape, job_id
        assert float(np.abs(served.audio - ref["waveform"]).max()) <= WAVEFORM_TOLERANCE, job_id


def test_concurrent_answers_equal_their_solo_runs(omni_server, solo, qwen3_omni_reference):
    jobs = qwen3_omni_reference["tiny"]["jobs"]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {job_id: pool.submit(Served, omni_server, PARITY, *_job_request(ref["job"]))
                   for job_id, ref in jobs.items()}
        together = {job_id: f.result() for job_id, f in futures.items()}
    for job_id, served in together.items():
        assert served.text == solo[job_id].text, job_id
        np.testing.assert_array_equal(served.audio, solo[job_id].audio, err_msg=job_id)


def test_a_failing_request_does_not_touch_the_others(omni_server, solo, qwen3_omni_reference):
    """A conversation longer than the thinker's cache (max_model_len 4096) fails with its field
    while the parity jobs stream beside it, each still equal to its solo run."""
    history = [{"role": "user", "content": "word " * 1500}, {"role": "assistant", "content": "ok " * 1500}] * 2
    jobs = qwen3_omni_reference["tiny"]["jobs"]
    with ThreadPoolExecutor(len(jobs) + 1) as pool:
        futures = {job_id: pool.submit(Served, omni_server, PARITY, *_job_request(ref["job"]))
                   for job_id, ref in jobs.items()}
        failing = pool.submit(Served, omni_server, PARITY, "And now?", {"messages": history})
        with pytest.raises(TritonStreamError, match="invalid_request: messages: the prompt takes"):
            failing.result()
        for job_id, f in futures.items():
            assert f.result().text == solo[job_id].text, job_id
            np.testing.assert_array_equal(f.result().audio, solo[job_id].audio, err_msg=job_id)


def test_seeded_answers_are_isolated(omni_server):
    requests = [("Tell me about the sea.", {"seed": seed, "do_sample": True, "temperature": 0.8, "top_k": 50,
                                            "talker_max_new_tokens": 40, "max_tokens": 40}) for seed in (1, 2, 3)]
    alone = [Served(omni_server, LONG, text, params) for text, params in requests]
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: Served(omni_server, LONG, *r), requests))
    for a, b in zip(alone, together):
        assert a.text == b.text
        np.testing.assert_array_equal(a.audio, b.audio)
    assert len({a.text for a in alone}) > 1   # the seeds matter


def test_audio_starts_while_the_thinker_still_writes(omni_server):
    served = Served(omni_server, LONG, "Please tell me a long story about the ocean.",
                    {**GREEDY, "talker_max_new_tokens": 120})
    kinds = [kind for kind, _ in served.order]
    first_text = next(t for kind, t in served.order if kind == "text")
    first_audio = next(t for kind, t in served.order if kind == "audio")
    last_text = max(t for kind, t in served.order if kind == "text")
    print(f"first text delta {first_text * 1000:.0f} ms, first audio {first_audio * 1000:.0f} ms, "
          f"thinker's last delta {last_text * 1000:.0f} ms, {kinds.count('text')} deltas, "
          f"{kinds.count('audio')} audio chunks")
    assert kinds[0] == "text"
    assert first_text < first_audio < last_text
    assert served.finish_reason == "stop"
    assert served.audio.size > 0


def test_text_only_answer_skips_the_audio_stages(omni_server):
    with_audio = Served(omni_server, LONG, "What is the capital of France?", {**GREEDY, "talker_max_new_tokens": 10})
    before = metric(omni_server, "omni_requests_total", pipeline=LONG, outcome="ok")
    text_only = Served(omni_server, LONG, "What is the capital of France?", {"do_sample": False, "return_audio": False})
    assert not text_only.chunks and text_only.text == with_audio.text and text_only.finish_reason == "stop"
    # counted as the entry finishes the request, just after its final response leaves
    assert wait_for(lambda: metric(omni_server, "omni_requests_total", pipeline=LONG, outcome="ok") == before + 1, 5)
    with pytest.raises(TritonStreamError, match="invalid_request: talker_max_new_tokens"):
        Served(omni_server, LONG, "Hi", {"return_audio": False, "talker_max_new_tokens": 5})


@pytest.mark.parametrize("leave_at", ["first text", "first audio"])
def test_a_client_that_leaves_frees_all_three_stages(omni_server, leave_at):
    """Leaving at the first text delta: the talker stream is opening or waits for its prefill's
    text, which never comes now; at the first audio: all three stages are at work."""
    stop = threading.Event()

    def leave():
        for part in stream_parts(omni_server.grpc_url, LONG, "Tell me everything about whales.", GREEDY):
            if (leave_at == "first audio" and part.audio is not None and part.audio.size) or \
                    (leave_at == "first text" and "TEXT_DELTA" in part.outputs):
                stop.set()
                return   # closes the gRPC stream: the server cancels the request

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda _: leave(), range(3)))
    assert stop.is_set()
    stages = [f"{LONG}__thinker", f"{LONG}__talker"]

    def all_free():
        return (metric(omni_server, "omni_active_streams", pipeline=LONG) == 0
                and all(metric(omni_server, "omni_stage_active_requests", model=m) == 0 for m in stages))
    assert wait_for(all_free, 5.0)
    after = Served(omni_server, LONG, "Hello again.", {**GREEDY, "talker_max_new_tokens": 10})
    assert after.text and after.audio.size


def test_the_talker_in_the_entry_answers_as_its_own_model(omni_talker_in_entry, solo, qwen3_omni_reference):
    """With the talker in the entry's process every parity job, alone and all at once, gives the
    answer text and audio of the talker as a model of its own, bit for bit."""
    jobs = qwen3_omni_reference["tiny"]["jobs"]
    alone = {job_id: Served(omni_talker_in_entry, PARITY, *_job_request(ref["job"])) for job_id, ref in jobs.items()}
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {job_id: pool.submit(Served, omni_talker_in_entry, PARITY, *_job_request(ref["job"]))
                   for job_id, ref in jobs.items()}
        together = {job_id: f.result() for job_id, f in futures.items()}
    for job_id in jobs:
        for run in (alone[job_id], together[job_id]):
            assert run.text == solo[job_id].text and run.finish_reason == solo[job_id].finish_reason, job_id
            np.testing.assert_array_equal(run.audio, solo[job_id].audio, err_msg=job_id)
    assert not (omni_talker_in_entry.repo / f"{PARITY}__talker").exists()   # no talker model: it is the entry's


def test_the_talker_in_the_entry_is_freed_by_a_client_that_leaves(omni_talker_in_entry):
    for _ in range(2):
        for part in stream_parts(omni_talker_in_entry.grpc_url, LONG, "Tell me everything about whales.", GREEDY):
            if part.audio is not None and part.audio.size:
                break   # closes the gRPC stream: the server cancels the request

    def all_free():
        return (metric(omni_talker_in_entry, "omni_active_streams", pipeline=LONG) == 0
                and all(metric(omni_talker_in_entry, "omni_stage_active_requests", model=m) == 0
                        for m in (f"{LONG}__thinker", f"{LONG}__talker")))
    assert wait_for(all_free, 5.0)
    after = Served(omni_talker_in_entry, LONG, "Hello again.", {**GREEDY, "talker_max_new_tokens": 10})
    assert after.text and after.audio.size


@pytest.mark.parametrize("text,params,field", [
    ("Hi", {"speaker": "nobody"}, "speaker"),
    ("Hi", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("Hi", {"messages": "not a list"}, "messages"),
    ("Hi", {"messages": [{"role": "user", "content": [{"type": "image", "image": "x"}]}]}, "messages[0].content[0]"),
    ("Hi", {"temperature": 0, "do_sample": True}, "temperature"),
    ("Hi", {"max_tokens": 0}, "max_tokens"),
    ("Hi", {"talker_top_p": 2.0}, "talker_top_p"),
    ("Hi", {"voice": "ethan"}, "voice"),
    ("   ", {}, "text"),
])
def test_bad_requests_name_the_field(omni_server, text, params, field):
    with pytest.raises(TritonStreamError, match=f"invalid_request: {field.replace('[', '.').replace(']', '.')}"):
        Served(omni_server, LONG, text, params)


# ----------------------------------------------------------------------------- audio input


def _audio_job_request(job: dict) -> tuple[str, dict]:
    """An audio job as a served request: the last user message's parts in PARAMS `content` (its
    last text part as TEXT when it ends with one, else an empty TEXT), earlier turns in `messages`."""
    messages = audio_job_messages(job, "openai")
    parts = list(messages[-1]["content"])
    text = parts.pop()["text"] if parts[-1]["type"] == "text" else ""
    params = {"do_sample": False, "speaker": job["speaker"], "return_audio": job.get("return_audio", True),
              "max_tokens": 64}
    if parts:
        params["content"] = parts
    if messages[:-1]:
        params["messages"] = messages[:-1]
    if params["return_audio"]:
        params.update(talker_do_sample=False, talker_max_new_tokens=128, talker_repetition_penalty=1.05)
    return text, params


@pytest.fixture(scope="module")
def audio_solo(omni_server, qwen3_omni_audio_reference):
    return {job["id"]: Served(omni_server, PARITY, *_audio_job_request(job)) for job in MEDIA_JOBS}


def test_served_audio_and_image_questions_equal_the_reference(audio_solo, qwen3_omni_audio_reference, tokenizer):
    """Recordings sent as input_audio parts (WAV, FLAC, MP3; 16 and 44.1 kHz; 0.5 to 30 s) and
    images as image_url data URLs (PNG, JPEG, RGBA; square, wide, tall; 64 to 640 pixels)."""
    for job_id, ref in qwen3_omni_audio_reference["tiny"]["jobs"].items():
        served = audio_solo[job_id]
        generated = ref["sequences"].tolist()[len(ref["input_ids"]):]
        assert served.text == tokenizer.decode(generated), job_id
        if not ref["job"]["return_audio"]:
            assert not served.chunks, job_id
            continue
        assert served.audio.shape == ref["waveform"].shape, job_id
        assert float(np.abs(served.audio - ref["waveform"]).max()) <= WAVEFORM_TOLERANCE, job_id


def test_concurrent_media_questions_equal_their_solo_runs(omni_server, audio_solo, solo, qwen3_omni_reference):
    """Audio, image and text conversations at once: each equal to its solo run bit for bit."""
    requests = {job["id"]: _audio_job_request(job) for job in MEDIA_JOBS}
    requests.update({job_id: _job_request(ref["job"]) for job_id, ref in qwen3_omni_reference["tiny"]["jobs"].items()})
    with ThreadPoolExecutor(len(requests)) as pool:
        futures = {job_id: pool.submit(Served, omni_server, PARITY, *request) for job_id, request in requests.items()}
        together = {job_id: f.result() for job_id, f in futures.items()}
    for job_id, served in together.items():
        alone = audio_solo.get(job_id) or solo[job_id]
        assert served.text == alone.text, job_id
        np.testing.assert_array_equal(served.audio, alone.audio, err_msg=job_id)


def _wav_part(seconds: float, rate: int = 16000) -> dict:
    import base64
    import io

    import soundfile as sf

    handle = io.BytesIO()
    sf.write(handle, np.zeros(int(rate * seconds), np.float32), rate, format="WAV", subtype="PCM_16")
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(handle.getvalue()).decode(),
                                                   "format": "wav"}}


@pytest.mark.parametrize("text,params,field,message", [
    ("What is it?", {"content": [{"type": "input_audio", "input_audio": {"data": "bm90IGF1ZGlv", "format": "wav"}}]},
     "content[0].input_audio.data", "is not audio"),
    ("What is it?", {"content": [_wav_part(121)]}, "content[0].input_audio.data", "at most 120 s"),
    ("What is it?", {"content": [{"type": "input_file", "file": {}}]}, "content[0]", "must be"),
    ("What is it?", {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]},
     "content[0].image_url.url", "not an image"),
    ("What is it?", {"content": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}]},
     "content[0].image_url.url", "does not fetch"),
    ("What is it?", {"content": []}, "content", "non-empty"),
    ("", {}, "text", "is empty"),
    ("And?", {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "@@"}}]},
                           {"role": "assistant", "content": "Yes."}]}, "messages[0].content[0].input_audio.data",
     "base64"),
])
def test_bad_audio_names_the_part(omni_server, text, params, field, message):
    with pytest.raises(TritonStreamError) as error:
        Served(omni_server, PARITY, text, params)
    assert f"invalid_request: {field}: " in str(error.value) and message in str(error.value)
    after = Served(omni_server, PARITY, "", {"content": [_wav_part(1.0)], "return_audio": False, "max_tokens": 4})
    assert after.text
