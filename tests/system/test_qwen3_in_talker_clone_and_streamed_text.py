"""code2wav in the talker's process (the talker stage's option `code2wav: in_talker`) for voice
cloning and streamed text, by one real tritonserver holding the tiny random CustomVoice and Base
pipelines, both built from their default deploys with that option; the module runs three times:
with the talker a Triton model of its own (`process: own`), inside the entry's process
(`process: entry`, omni_backend/triton/local_stage.py: one process for the whole pipeline), and
there with `code2wav: adaptive` (windows decoded in the talker while a request is alone there, by
code2wav while it has company: the concurrent runs below mix both within one stream).

- a served clone equals the in-process engine + windowed decoder bit for bit, in-context (the
  reference codes codec left context, never heard; also the reference's decode of ref + new codes
  after its cut, to 1e-4; also with the request's own chunk sizes) and x-vector only; the talker
  sends audio, never codes or context codes;
- text appended in pieces (`streaming_input`, CustomVoice and an x-vector clone) equals the same
  text sent whole, bit for bit;
- four concurrent mixed requests (clones and streamed text) each equal their solo run;
- streams cancelled mid-utterance (by control message and by gRPC cancel), as many as the
  talker's engine has slots, free them: the talker's active count returns to 0 and a request after
  them gets a slot at once and equals its solo run;
- streamed text that stops coming ends with `invalid_request: text:` after `text_wait_s`, having
  spoken what it had, and frees its slot.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
import yaml

from client.triton_stream import astream, synthesize
from client.triton_text_stream import TextInputStream
from tests.metrics_scrape import metric, wait_for
from tests.qwen3_fixtures import talker_stage_responses
from tests.qwen3_voice_clone_reference import GREEDY, VOICE_TEXTS, CloneReference, hibari_voices, wav_data_url
from tests.served_pipeline import served
from tests.system.streamed_text import assert_text_wait_ends_the_stream, cuts

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]
CUSTOM = "qwen3_tts_tiny_random"
BASE = "qwen3_tts_tiny_random_base"
ENGLISH = "Hello world, this is a streaming test. It speaks while an LLM is still writing!"
TEXT_WAIT_S = 4.0


@pytest.fixture(scope="module", params=["own", "entry", "entry+adaptive"])
def process(request) -> str:
    """Where the talker runs (stage 0's deploy key `process`; `+adaptive`: with `code2wav: adaptive`)."""
    return request.param


@pytest.fixture(scope="module")
def deploys(tmp_path_factory, process) -> dict[str, Path]:
    """Each pipeline's default deploy with stage 0's `code2wav: in_talker` and `process` (CustomVoice's
    with a short `text_wait_s`)."""
    base = tmp_path_factory.mktemp("in_talker_deploys")
    out = {}
    for pipeline in (CUSTOM, BASE):
        deploy = yaml.safe_load((ROOT / "deploy" / f"{pipeline}.yaml").read_text())
        where, _, placement = process.partition("+")
        deploy["stages"][0].setdefault("options", {})["code2wav"] = placement or "in_talker"
        deploy["stages"][0]["process"] = where
        if pipeline == CUSTOM:   # a short wait for text, so its bound can be seen
            deploy["stages"][0]["options"]["text_wait_s"] = TEXT_WAIT_S
        out[pipeline] = base / f"{pipeline}.in_talker.yaml"
        out[pipeline].write_text(yaml.safe_dump(deploy))
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory, fresh_builtin_checkpoints, deploys):
    with served(deploys, tmp_path_factory.mktemp("in_talker_clone_text")) as server:
        yield server


@pytest.fixture(scope="module")
def voices() -> list[np.ndarray]:
    return hibari_voices()


@pytest.fixture(scope="module")
def reference(server, deploys) -> CloneReference:
    return CloneReference(BASE, deploys[BASE])


def _requests(voices) -> dict[str, tuple[str, list[str] | str, dict]]:
    """name -> (pipeline, text (a list: appended in pieces), params)."""
    icl = {**GREEDY, "ref_audio": wav_data_url(voices[0]), "ref_text": VOICE_TEXTS[0], "language": "english",
           "max_new_tokens": 20}
    xvec = {**GREEDY, "ref_audio": wav_data_url(voices[1]), "x_vector_only_mode": True, "max_new_tokens": 14}
    return {
        "clone_icl": (BASE, "Cloned speech, served.", icl),
        "clone_xvec": (BASE, "Only the x-vector.", xvec),
        "streamed_custom": (CUSTOM, cuts(ENGLISH, 1), {**GREEDY, "voice": "ryan", "language": "english",
                                                       "max_new_tokens": 24}),
        "streamed_clone_xvec": (BASE, cuts("The weather is fine, so we walk.", 2),
                                {**xvec, "ref_audio": wav_data_url(voices[2]), "max_new_tokens": 16}),
    }


async def _speak(client, pipeline: str, text: list[str] | str, params: dict) -> np.ndarray:
    """One request's audio; a list of pieces opens the stream with the first and appends the rest."""
    if isinstance(text, str):
        return np.concatenate([audio async for audio, _ in astream(client, pipeline, text, params)])
    stream = TextInputStream(client, pipeline, params, uuid.uuid4().hex)
    chunks: list[np.ndarray] = []

    async def read():
        async for audio, _rate in stream.start(text[0]):
            chunks.append(audio)

    reader = asyncio.ensure_future(read())
    try:
        for piece in text[1:]:
            await stream.append(piece)
        await stream.end()
        await asyncio.wait_for(reader, 120)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    return np.concatenate(chunks)


def _run(url: str, jobs: list[tuple[str, list[str] | str, dict]]) -> list[np.ndarray]:
    """The jobs at once, on one client."""
    async def scenario():
        client = aioclient.InferenceServerClient(url)
        try:
            return await asyncio.gather(*(_speak(client, *job) for job in jobs))
        finally:
            await client.close()
    return asyncio.run(scenario())


@pytest.fixture(scope="module")
def solo(server, voices) -> dict[str, np.ndarray]:
    """Each of the mixed requests served alone."""
    return {name: _run(server.grpc_url, [job])[0] for name, job in _requests(voices).items()}


def test_served_clone_equals_in_process(server, reference, voices, solo):
    jobs = _requests(voices)
    _, text, params = jobs["clone_icl"]
    codes, context = reference.run(text, params)
    assert context is not None and len(codes) == params["max_new_tokens"] - 1
    served = solo["clone_icl"]
    assert served.size == len(codes) * 1920   # the reference codes' audio is never heard
    np.testing.assert_array_equal(served, reference.windowed_audio(codes, context))
    cut = reference.full_decode_cut(codes, context)
    shift = cut.size - served.size   # the reference's proportional cut may keep one more sample
    assert shift in (0, 1)
    assert np.abs(cut[shift:] - served).max() <= 1e-4

    _, text, params = jobs["clone_xvec"]
    codes, context = reference.run(text, params)
    assert context is None
    np.testing.assert_array_equal(solo["clone_xvec"], reference.windowed_audio(codes, None))

    # the request's own chunks: a left context shorter than the reference codes reaches into them
    params = {**jobs["clone_icl"][2], "initial_chunk_frames": 3, "chunk_frames": 5, "left_context_frames": 10}
    codes, context = reference.run("Chunked my own way.", params)
    assert len(context) > 10
    served = synthesize(server.grpc_url, BASE, "Chunked my own way.", params)
    schedule = reference.deploy.async_chunk.chunk_schedule(3, 5, 10)
    assert [c.size // 1920 for c in served.chunks] == [w.new_frames for w in schedule.plan(len(codes))]
    np.testing.assert_array_equal(served.audio, reference.windowed_audio(codes, context, params))


def test_the_talker_sends_a_clone_audio_not_codes(server, reference, voices, process):
    """In-context: the reference codes stay in the talker (codec context of its own windows). In
    the entry's process the talker has no Triton model to ask: the repository has none."""
    if process.startswith("entry"):
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_model_ready(BASE) and not client.is_model_ready(f"{BASE}__talker")
        client.close()
        assert not (server.repo / f"{BASE}__talker").exists()
        return
    _, text, params = _requests(voices)["clone_icl"]
    req = reference.adapter.validate(text, {**params, "max_new_tokens": 8})
    responses = talker_stage_responses(server.grpc_url, BASE, req, outputs=("AUDIO", "CODES", "CONTEXT_CODES"))
    assert all(r["CODES"] is None and r["CONTEXT_CODES"] is None for r in responses)
    assert [r["AUDIO"].size // 1920 for r in responses] == [2, 2, 3]


@pytest.mark.parametrize("name,whole", [("streamed_custom", ENGLISH),
                                        ("streamed_clone_xvec", "The weather is fine, so we walk.")])
def test_streamed_text_equals_whole_text(server, voices, solo, name, whole):
    pipeline, pieces, params = _requests(voices)[name]
    assert "".join(pieces) == whole and len(pieces) > 5
    sent_whole, one_char = (_run(server.grpc_url, [(pipeline, text, params)])[0] for text in ([whole], list(whole)))
    assert sent_whole.size == (params["max_new_tokens"] - 1) * 1920
    np.testing.assert_array_equal(solo[name], sent_whole)
    np.testing.assert_array_equal(one_char, sent_whole)


def test_four_concurrent_mixed_requests_equal_their_solo_runs(server, voices, solo):
    jobs = _requests(voices)
    together = _run(server.grpc_url, list(jobs.values()))
    for name, audio in zip(jobs, together):
        np.testing.assert_array_equal(audio, solo[name], err_msg=name)


def test_cancelled_streams_free_their_engine_slots(server, voices, solo, deploys):
    """As many long streams as the talker's engine has slots, each cancelled after its first audio
    (clones by control message, streamed text, its input still open, by gRPC cancel): a request
    after them gets a slot at once."""
    slots = yaml.safe_load(deploys[BASE].read_text())["stages"][0]["max_num_seqs"]
    jobs = _requests(voices)
    long = {"max_new_tokens": 2000, "ignore_eos": True}   # a slot left held would be held for minutes
    _, _, icl = jobs["clone_icl"]
    _, pieces, xvec = jobs["streamed_clone_xvec"]

    async def first_audio_then_leave(client, i: int) -> int:
        if i % 2:   # streamed text, its text still open: the gRPC call is cancelled
            stream = TextInputStream(client, BASE, {**xvec, **long}, uuid.uuid4().hex)
            audio = stream.start(pieces[0])
        else:       # a clone in context: the entry is asked to end it (CONTROL=cancel)
            audio = astream(client, BASE, f"A long story number {i}.", {**icl, **long})
        first = asyncio.ensure_future(audio.__anext__())
        try:
            if i % 2:
                for piece in pieces[1:]:
                    await stream.append(piece)
            chunk, _ = await first
            return chunk.size
        finally:
            await asyncio.gather(first, return_exceptions=True)
            await audio.aclose()

    async def scenario():
        client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            return await asyncio.gather(*(first_audio_then_leave(client, i) for i in range(slots)))
        finally:
            await client.close()

    before = metric(server.metrics_url, "omni_requests_total", pipeline=BASE, outcome="cancelled")
    t0 = time.monotonic()
    assert all(size > 0 for size in asyncio.run(scenario()))
    assert time.monotonic() - t0 < 60
    talker = f"{BASE}__talker"
    assert wait_for(server.metrics_url, "omni_stage_active_requests", 0, model=talker) == 0
    assert wait_for(server.metrics_url, "omni_active_streams", 0, pipeline=BASE) == 0
    assert metric(server.metrics_url, "omni_requests_total", pipeline=BASE, outcome="cancelled") >= before + slots
    _, text, params = jobs["clone_icl"]
    after = synthesize(server.grpc_url, BASE, text, params)
    assert after.ttfa_s < 10   # it found a free slot (a leaked one frees after minutes)
    np.testing.assert_array_equal(after.audio, solo["clone_icl"])


def test_text_wait_bound_ends_the_stream_and_frees_the_slot(server, voices, solo):
    """Text that stops coming: the talker speaks what it had (its completed windows), then the
    stream ends with `invalid_request: text:` and the slot is free."""
    assert_text_wait_ends_the_stream(server, CUSTOM, {**GREEDY, "voice": "ryan", "max_new_tokens": 60}, TEXT_WAIT_S)
    pipeline, pieces, params = _requests(voices)["streamed_custom"]
    np.testing.assert_array_equal(_run(server.grpc_url, [(pipeline, pieces, params)])[0], solo["streamed_custom"])
