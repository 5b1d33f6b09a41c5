"""The FastAPI application: middleware, error envelopes, lifespan of the Triton pool."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from client.speech_api.access_log import AccessLogMiddleware
from client.speech_api.admission import StreamLimiter
from client.speech_api.auth import ApiKeys
from client.speech_api.catalog import Catalog
from client.speech_api.chat_request import AudioTranscripts
from client.speech_api.config import ShimConfig
from client.speech_api.discovery import TritonService
from client.speech_api.errors import ApiError, invalid_request, not_found
from client.speech_api.pool import TritonPool
from client.speech_api.routes import STATIC_DIR, router
from client.speech_api.voices import VoiceRegistry, default_voices_dir
from omni_backend.glibc_heaps import freeze_loaded_objects, release_free_memory_every

log = logging.getLogger("omni.speech_api")
EXPOSED_HEADERS = ["x-request-id", "retry-after", "retry-after-ms", "x-omni-model", "x-omni-ttfa-ms",
                   "x-omni-sample-rate", "x-omni-ignored-fields"]


class Shim:
    """What the routes share: settings, keys, catalog, pool, limiter."""

    def __init__(self, config: ShimConfig):
        self.config = config
        self.api_keys = ApiKeys(config.api_keys)
        self.catalog = Catalog(config.default_pipeline, model_names=config.model_names)
        self.pool = TritonPool(config.tritons, self.catalog, probe_interval_s=config.probe_interval_s,
                               services=[TritonService.parse(s) for s in config.triton_services],
                               resolve_interval_s=config.resolve_interval_s)
        self.limiter = StreamLimiter(config.max_streams_per_pipeline, config.retry_after_s)
        self.voices = VoiceRegistry(config.voices_dir or default_voices_dir())
        self.chat_audio = AudioTranscripts()   # earlier chat answers' transcripts, by audio id
        self.started_at = time.time()


def error_response(error: ApiError) -> Response:
    # ApiError.body() escapes to ASCII: a client's lone surrogate quoted in a message must not
    # make the error itself unencodable (JSONResponse writes UTF-8 and would fail with a 500).
    return Response(error.body(), status_code=error.status, headers=error.headers,
                    media_type="application/json")


def create_app(config: ShimConfig) -> FastAPI:
    shim = Shim(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await shim.pool.start()
        freeze_loaded_objects()   # the periodic full collection skips what start-up loaded
        trimming = asyncio.ensure_future(release_free_memory_every())
        log.info("speech API over %s; models: %s; API keys %s",
                 ", ".join([*config.tritons, *(f"{s} (DNS)" for s in config.triton_services)]),
                 ", ".join(shim.catalog.model_names()) or "none yet",
                 "on" if shim.api_keys.enabled else "off")
        try:
            yield
        finally:
            trimming.cancel()
            await shim.pool.close()

    app = FastAPI(title="omni-triton-tts speech API", version="0.1.0", lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    app.state.shim = shim
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        request.state.access["error"] = exc.code
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        first = (exc.errors() or [{}])[0]
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        return error_response(invalid_request(".".join(loc) or None, first.get("msg", "invalid request")))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return error_response(not_found(request.url.path))
        return error_response(ApiError(exc.status_code, str(exc.detail), type="invalid_request_error",
                                       code=None, headers=dict(exc.headers or {})))

    # Outermost last: the access log sees (and tags) every response, CORS preflights included.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"],
                       expose_headers=EXPOSED_HEADERS, max_age=600)
    app.add_middleware(AccessLogMiddleware)
    return app
