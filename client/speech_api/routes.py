"""The HTTP surface: speech, chat, models, voices, health and the web page; the speech WebSocket."""
from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse

from client.speech_api.catalog import OPENAI_MODEL_ALIASES
from client.speech_api.chat_completion import ChatCompletion
from client.speech_api.chat_request import build_chat_params, parse_chat_body, refuse_chat_pipeline
from client.speech_api.media_fetch import fetch_message_media, fetch_ref_audio
from client.speech_api.encoders import CONTENT_TYPES
from client.speech_api.encoders.pcm import PCM_RATE
from client.speech_api.errors import ApiError, from_triton, internal, invalid_request, model_not_found, no_backend
from client.speech_api.request import body_error, build_triton_params, parse_speech_body
from client.speech_api.sse import CONTENT_TYPE as SSE_CONTENT_TYPE
from client.speech_api.response import AudioStreamResponse, WatchedResponse
from client.speech_api.realtime import RealtimeSession
from client.speech_api.speech_batch import batch_items, run_batch
from client.speech_api.speech_stream import SpeechStreamSession
from client.speech_api.synthesis import SpeechSynthesis
from client.speech_api.voices import MAX_AUDIO_BYTES
from client.triton_stream import TritonStreamError

log = logging.getLogger("omni.speech_api")
STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
MAX_BODY_BYTES = 24 * 1024 * 1024
router = APIRouter()


def _shim(request: Request):
    return request.app.state.shim


def _authorize(request: Request) -> None:
    _shim(request).api_keys.check(request.headers.get("authorization"))


async def _resolve(request: Request, model: str) -> str:
    """The pipeline behind `model`: 404 when Triton is up and lacks it, 503 when none is up."""
    shim = _shim(request)
    pipeline = shim.catalog.resolve(model)
    if pipeline is None and not shim.pool.any_healthy():
        await shim.pool.probe_all()
        pipeline = shim.catalog.resolve(model)
    if pipeline is None:
        if not shim.pool.any_healthy():
            raise no_backend("No Triton server is reachable", shim.config.retry_after_s * 2)
        known = shim.catalog.model_names_given.get(model) or (
            shim.catalog.default_pipeline if model in OPENAI_MODEL_ALIASES else model)
        if known in shim.pool.unserved():   # served before, being restarted now: come back soon
            raise no_backend(f"The model '{model}' is restarting; retry shortly", shim.config.retry_after_s * 2)
        raise model_not_found(model, shim.catalog.model_names())
    return pipeline


def _default_model(shim) -> str:
    model = shim.catalog.default_model()
    if model is None:
        raise invalid_request("model", "model: is required when the server serves several models ("
                                       + ", ".join(shim.catalog.model_names()) + ")",
                              code="missing_required_parameter")
    return model


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """Ready (200) when every pipeline a Triton has served is served by one now; 503 while one
    is not (its stage died and is being reloaded, its server is down or stopping)."""
    shim = _shim(request)
    tritons = shim.pool.status()
    unserved = shim.pool.unserved()
    ready = any(t["healthy"] and t["pipelines"] for t in tritons) and not unserved
    body = {"status": "ok" if ready else "unavailable", "tritons": tritons,
            "models": shim.catalog.model_names(), "unserved": unserved}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    _authorize(request)
    shim = _shim(request)
    created = int(shim.started_at)
    data = []
    for name in shim.catalog.model_names():
        pipeline = shim.catalog.resolve(name)
        info = shim.catalog.get(pipeline) if pipeline else None
        # `chat`: answers POST /v1/chat/completions rather than reading text aloud; `speaks`: a chat
        # model's answers can be spoken
        entry = {"id": name, "object": "model", "created": created, "owned_by": "omni-triton-tts",
                 "pipeline": pipeline, "chat": bool(info is not None and info.chat)}
        if info is not None and info.chat:
            entry["speaks"] = info.speaks
        data.append(entry)
    return JSONResponse({"object": "list", "data": data})


@router.get("/v1/models/{model}")
async def get_model(request: Request, model: str) -> JSONResponse:
    _authorize(request)
    shim = _shim(request)
    pipeline = await _resolve(request, model)
    info = shim.catalog.get(pipeline)
    body = {"id": model, "object": "model", "created": int(shim.started_at), "owned_by": "omni-triton-tts",
            "pipeline": pipeline}
    if info is not None and info.known:   # what the pipeline accepts (its request parameters)
        body.update(description=info.description, sample_rate=info.sample_rate, voices=info.voices,
                    default_voice=info.default_voice, clones_voices=info.clones_voices,
                    parameters=list(info.params))
    if info is not None:
        body["chat"] = info.chat
        if info.chat:   # whether its answers can be spoken (modalities ["text", "audio"])
            body["speaks"] = info.speaks
    return JSONResponse(body)


@router.get("/v1/audio/voices")
async def list_voices(request: Request) -> JSONResponse:
    """`{"model", "voices": [...], "default"}` for `?model=` (default: the default pipeline),
    plus `models`: every pipeline's voices, and `registered`: the uploaded voices (which are the
    voices of pipelines that clone voices)."""
    _authorize(request)
    shim = _shim(request)
    registered = shim.voices.list()
    model = request.query_params.get("model") or shim.catalog.default_pipeline
    pipeline = await _resolve(request, model)
    info = shim.catalog.get(pipeline)

    def voices_of(p) -> list[str]:   # a speaker-embedding voice only where the model takes one
        if not p.clones_voices:
            return p.voices
        return p.voices + [v.name for v in registered if not v.is_embedding or p.accepts("speaker_embedding")]

    every = {name: voices_of(p) for name, p in sorted(shim.catalog.pipelines().items())}
    return JSONResponse({"model": pipeline, "voices": voices_of(info),
                         "default": info.default_voice, "clones_voices": info.clones_voices, "models": every,
                         "registered": [v.public() for v in registered],
                         "uploaded_voices": [v.uploaded() for v in registered]})


async def _form_audio(form) -> bytes:
    upload = form.get("audio") or form.get("audio_sample") or form.get("file")   # ours, vLLM-Omni's, a generic
    if upload is None or isinstance(upload, str):
        raise invalid_request("audio", "audio: required, as a file part (wav, flac or mp3, at most 10 MiB)",
                              code="missing_required_parameter")
    data = await upload.read(MAX_AUDIO_BYTES + 1)
    if len(data) > MAX_AUDIO_BYTES:
        raise invalid_request("audio", f"audio: larger than {MAX_AUDIO_BYTES} bytes")
    return data


@router.post("/v1/audio/voices")
async def create_voice(request: Request) -> JSONResponse:
    """Upload a voice (multipart: name, audio, ref_text, consent, speaker_description; or a
    speaker_embedding instead of audio); see voices.py."""
    _authorize(request)
    shim = _shim(request)
    if not request.headers.get("content-type", "").startswith(("multipart/form-data",
                                                                "application/x-www-form-urlencoded")):
        raise invalid_request(None, "Upload a voice as multipart/form-data with name, audio, ref_text and consent")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except Exception as e:  # noqa: BLE001 - malformed multipart
        raise invalid_request(None, f"The multipart body does not parse ({e})") from None
    try:
        def text(name):
            value = form.get(name)
            if value is not None and not isinstance(value, str):
                raise invalid_request(name, f"{name}: must be a text field")
            return value

        embedding = text("speaker_embedding")   # vLLM-Omni's: a voice that is a speaker embedding
        if embedding is not None:
            if any(form.get(k) is not None for k in ("audio", "audio_sample", "file")):
                raise invalid_request("speaker_embedding", "speaker_embedding: a voice is a recording or a speaker "
                                                           "embedding; the two are mutually exclusive")
            if text("ref_text") is not None:
                raise invalid_request("ref_text", "ref_text: the transcript of a recording; this voice is a "
                                                  "speaker embedding")
            voice = await asyncio.to_thread(shim.voices.add_embedding, text("name"), embedding, text("consent"),
                                            text("speaker_description"))
        else:
            audio = await _form_audio(form)
            voice = await asyncio.to_thread(shim.voices.add, text("name"), audio, text("ref_text"), text("consent"),
                                            text("speaker_description"))
    finally:
        await form.close()
    # ours, plus the shape vLLM-Omni's clients read
    return JSONResponse({**voice.public(), "success": True, "voice": voice.uploaded()}, status_code=201)


@router.get("/v1/audio/voices/{name}")
async def get_voice(request: Request, name: str) -> JSONResponse:
    _authorize(request)
    voice = _shim(request).voices.get(name)
    if voice is None:
        raise ApiError(404, f"No voice named {name!r}", type="invalid_request_error", code="voice_not_found",
                       param="name")
    return JSONResponse(voice.public())


@router.delete("/v1/audio/voices/{name}")
async def delete_voice(request: Request, name: str) -> JSONResponse:
    _authorize(request)
    if not await asyncio.to_thread(_shim(request).voices.remove, name):
        raise ApiError(404, f"No voice named {name!r}", type="invalid_request_error", code="voice_not_found",
                       param="name")
    return JSONResponse({"id": name.strip().lower(), "object": "voice", "deleted": True})


def body_too_large() -> ApiError:
    """413, not 400: the body is refused for its size before it is parsed (OpenAI's envelope)."""
    return ApiError(413, f"The request body is larger than {MAX_BODY_BYTES} bytes",
                    type="invalid_request_error", code="request_too_large")


async def _json_body(request: Request):
    """The decoded JSON body, refused by its size before it is parsed."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise body_too_large()    # before reading a byte of it
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_BODY_BYTES:
            raise body_too_large()
    try:
        return json.loads(bytes(raw))
    except (ValueError, RecursionError) as e:   # UnicodeDecodeError is a ValueError
        raise body_error(e) from None


@router.post("/v1/audio/speech")
async def create_speech(request: Request):
    _authorize(request)
    shim = _shim(request)
    access = request.state.access
    body = await _json_body(request)
    await fetch_ref_audio(body, shim.config.fetch)   # an http(s) URL, where the operator allows its host
    speech = parse_speech_body(body)
    if speech.model is None:
        speech.model = _default_model(shim)
    pipeline = await _resolve(request, speech.model)
    info = shim.catalog.get(pipeline)
    refuse_chat_pipeline(info)
    triton_request = build_triton_params(speech, info, shim.voices)
    access.update(model=pipeline, format=speech.response_format,
                  stream=speech.stream_format, speed=speech.speed)
    synthesis = SpeechSynthesis(shim.pool, shim.limiter, triton_request, speech.response_format,
                                speech.stream_format, request.state.request_id, access, info.sample_rate)
    await synthesis.start()
    headers = {"x-omni-model": pipeline, "x-omni-ttfa-ms": f"{access['ttfa_ms']:.1f}",
               "x-omni-sample-rate": str(PCM_RATE if speech.response_format == "pcm" else synthesis.sample_rate)}
    if triton_request.ignored:
        headers["x-omni-ignored-fields"] = ",".join(triton_request.ignored)
    media = SSE_CONTENT_TYPE if speech.stream_format == "sse" else CONTENT_TYPES[speech.response_format]
    if not speech.stream:   # `stream: false`: the whole file, its length known, or an error status
        return WatchedResponse(synthesis.whole(), media_type=media, headers=headers, abandon=synthesis.close)
    return AudioStreamResponse(synthesis.body(), media_type=media, headers=headers, close=synthesis.close)


@router.post("/v1/audio/speech/batch")
async def create_speech_batch(request: Request):
    """vLLM-Omni's batch: each item's whole audio in one JSON answer (client/speech_api/speech_batch.py)."""
    _authorize(request)
    shim = _shim(request)
    shared, bodies = batch_items(await _json_body(request))
    model = shared.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise invalid_request("model", f"model: must be a model name, got {model!r}"[:200])
    pipeline = await _resolve(request, model.strip() if model else _default_model(shim))
    info = shim.catalog.get(pipeline)
    refuse_chat_pipeline(info)
    request.state.access.update(model=pipeline, format="batch", items=len(bodies))

    async def speak(i: int, body: dict) -> tuple[bytes, str]:
        try:
            body = {**body, "model": pipeline}
            await fetch_ref_audio(body, shim.config.fetch)
            speech = parse_speech_body(body)
            triton_request = build_triton_params(speech, info, shim.voices)
            synthesis = SpeechSynthesis(shim.pool, shim.limiter, triton_request, speech.response_format, "audio",
                                        f"{request.state.request_id}-{i}", {}, info.sample_rate)
            try:
                await synthesis.start()
                data = b"".join([part async for part in synthesis.body()])
            finally:
                await synthesis.close()
            return data, CONTENT_TYPES[speech.response_format]
        except TritonStreamError as e:
            raise from_triton(str(e)) from None
        except ApiError:
            raise
        except Exception:   # noqa: BLE001 - one item's failure is its own error result
            log.exception("batch %s item %d failed", request.state.request_id, i)
            raise internal("this item failed inside the server") from None

    async def answer() -> tuple[int, dict[str, str], bytes]:
        return 200, {}, json.dumps(await run_batch(bodies, speak)).encode()

    return WatchedResponse(answer(), media_type="application/json")


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request):
    """A chat pipeline's answer as text, or text and audio (client/speech_api/chat_completion.py)."""
    _authorize(request)
    shim = _shim(request)
    access = request.state.access
    chat = parse_chat_body(await _json_body(request), shim.chat_audio)
    # http(s) image and audio URLs become data URLs here, where the operator allowed their hosts
    # (else a 400), and audio_url parts input_audio ones
    chat.audio_url_parts = await fetch_message_media(
        [(i, m["content"]) for i, m in enumerate(chat.history)]
        + ([(len(chat.history), chat.parts)] if chat.parts else []), shim.config.fetch)
    pipeline = await _resolve(request, chat.model)
    info = shim.catalog.get(pipeline)
    if info is None or not info.chat:
        chatting = ", ".join(name for name, p in sorted(shim.catalog.pipelines().items()) if p.chat)
        raise invalid_request("model", f"model: '{chat.model}' reads text aloud and does not chat; use "
                                       f"POST /v1/audio/speech, or a chat model ({chatting or 'none is loaded'})")
    triton = build_chat_params(chat, info)
    access.update(model=pipeline, format=chat.audio_format or "text", stream="sse" if chat.stream else "json")
    completion = ChatCompletion(shim.pool, shim.limiter, chat, triton, chat.model, request.state.request_id,
                                access, shim.chat_audio)
    await completion.start()
    headers = {"x-omni-model": pipeline, "x-omni-ttfa-ms": f"{access['ttfa_ms']:.1f}"}
    if chat.stream:
        return AudioStreamResponse(completion.chunks(), media_type=SSE_CONTENT_TYPE, headers=headers,
                                   close=completion.close)

    async def answer() -> tuple[int, dict[str, str], bytes]:
        try:
            return 200, {}, ChatCompletion.json_body(await completion.complete())
        except ApiError as e:
            access["error"] = e.code
            access["outcome"] = f"error {e.status}"
            return e.status, e.headers, e.body()

    return WatchedResponse(answer(), media_type="application/json", headers=headers, abandon=completion.close)


async def _ws_authorized(websocket: WebSocket) -> bool:
    """The API key of a WebSocket (browsers cannot set headers on one: `?api_key=` then); a bad
    one closes it (1008)."""
    key = websocket.query_params.get("api_key")
    try:
        websocket.app.state.shim.api_keys.check(websocket.headers.get("authorization")
                                                or (f"Bearer {key}" if key else None))
    except ApiError:
        await websocket.close(code=1008, reason="invalid_api_key")
        return False
    return True


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(websocket: WebSocket) -> None:
    """Text in as it is written, audio out as it is made (client/speech_api/speech_stream.py)."""
    if await _ws_authorized(websocket):
        await SpeechStreamSession(websocket, websocket.app.state.shim).run()


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    """A spoken turn in, a spoken answer out (client/speech_api/realtime.py)."""
    if await _ws_authorized(websocket):
        await RealtimeSession(websocket, websocket.app.state.shim).run()


__all__ = ["router", "STATIC_DIR"]
