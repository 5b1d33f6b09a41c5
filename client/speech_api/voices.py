"""Uploaded voices: a recording (+ transcript) stored once under a name and reused by requests.

`POST /v1/audio/voices` (multipart: `name`, `audio` (or vLLM-Omni's `audio_sample`) wav/flac/mp3
<= 10 MiB and 1..30 s, `ref_text`, `consent`, `speaker_description`) stores the recording on disk under ``<voices dir>/<name>/`` (the audio
bytes as uploaded and ``voice.json``), written to a temporary folder and renamed into place, so
the registry survives restarts and never holds half a voice. A speech request whose `voice` is a
registered name, on a pipeline that clones voices, sends the stored recording as `ref_audio` (and
its transcript as `ref_text`; without a transcript the clone uses the speaker embedding only).
The pipeline's stage that encodes recordings caches them by their hash, so a voice is encoded once.

A voice may instead be a speaker embedding (vLLM-Omni's form field `speaker_embedding`: a JSON
list of finite numbers, not with a recording), stored as ``embedding.json``: a request naming it
sends it as `speaker_embedding` to a pipeline that takes one; a pipeline that
clones from recordings only refuses it, naming `voice`.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import math
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from client.speech_api.catalog import OPENAI_VOICES
from client.speech_api.errors import invalid_request

MAX_AUDIO_BYTES = 10 * 1024 * 1024
MAX_EMBEDDING = 4096   # numbers in a speaker embedding (the speech request's limit)
EMBEDDING = "embedding"   # the `format` of a voice that is a speaker embedding
MIN_SECONDS, MAX_SECONDS = 1.0, 30.0
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
# `consent` states the speaker's agreement: a word that says so, or the id of a consent record
# (vLLM-Omni's clients send one); a word that says no is refused
REFUSALS = ("false", "no", "0", "off", "none", "denied", "null")
FORMATS = {"WAV": ("wav", "audio/wav"), "FLAC": ("flac", "audio/flac"), "MP3": ("mp3", "audio/mpeg"),
           "OGG": ("ogg", "audio/ogg")}


def default_voices_dir() -> str:
    """$OMNI_VOICES_DIR, else voices/ under $OMNI_CACHE_DIR (default ~/.cache/omni-triton)."""
    cache = os.environ.get("OMNI_CACHE_DIR") or str(Path.home() / ".cache" / "omni-triton")
    return os.environ.get("OMNI_VOICES_DIR") or str(Path(cache) / "voices")


@dataclass
class RegisteredVoice:
    name: str
    ref_text: str | None
    consent: str
    created_at: int
    sha256: str
    bytes: int
    duration_s: float
    sample_rate: int
    format: str
    audio_file: str
    speaker_description: str | None = None
    embedding_dim: int | None = None   # a speaker embedding, not a recording

    @property
    def is_embedding(self) -> bool:
        return self.format == EMBEDDING

    def public(self) -> dict:
        out = asdict(self)
        out.pop("audio_file")
        for key in ("speaker_description", "embedding_dim"):
            if out[key] is None:
                out.pop(key)
        return {"id": self.name, "object": "voice", **out}

    def uploaded(self) -> dict:
        """The entry vLLM-Omni's API lists in `uploaded_voices` (its clients read these names)."""
        mime = "application/json" if self.is_embedding else next(m for e, m in FORMATS.values() if e == self.format)
        out = {"name": self.name, "consent": self.consent, "created_at": self.created_at, "file_size": self.bytes,
               "mime_type": mime}
        if self.is_embedding:
            out.update(embedding_source="direct", embedding_dim=self.embedding_dim)
        out.update({k: v for k, v in (("ref_text", self.ref_text),
                                      ("speaker_description", self.speaker_description)) if v is not None})
        return out


def check_name(raw: str | None) -> str:
    name = (raw or "").strip().lower()
    if not NAME_PATTERN.match(name):
        raise invalid_request("name", "name: 1-64 characters of a-z, 0-9, '_', '-', '.', starting with a letter "
                                      "or digit")
    if name in OPENAI_VOICES:
        raise invalid_request("name", f"name: {name!r} is one of OpenAI's stock voice names; choose another")
    return name


def parse_embedding(raw: Any) -> list[float]:
    """A speaker embedding from an upload's text field (JSON) or a list: 1..MAX_EMBEDDING finite
    numbers; 400 naming `speaker_embedding` otherwise."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise invalid_request("speaker_embedding", "speaker_embedding: not valid JSON (a list of numbers)") from None
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_EMBEDDING:
        raise invalid_request("speaker_embedding", f"speaker_embedding: must be a list of 1..{MAX_EMBEDDING} numbers")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in raw):
        raise invalid_request("speaker_embedding", "speaker_embedding: every value must be a finite number")
    return [float(x) for x in raw]


def probe_audio(data: bytes) -> tuple[float, int, str]:
    """(seconds, sample rate, format) of an uploaded recording; 400 naming `audio` otherwise."""
    import soundfile as sf

    if len(data) > MAX_AUDIO_BYTES:
        raise invalid_request("audio", f"audio: {len(data)} bytes; the limit is {MAX_AUDIO_BYTES}")
    if not data:
        raise invalid_request("audio", "audio: is empty")
    try:
        info = sf.info(io.BytesIO(data))
    except Exception:  # noqa: BLE001 - libsndfile: "Format not recognised" and the like
        raise invalid_request("audio", "audio: not a recording this server can read (wav, flac or mp3)") from None
    if info.format not in FORMATS:
        raise invalid_request("audio", f"audio: format {info.format} is not accepted (wav, flac or mp3)")
    seconds = info.frames / float(info.samplerate) if info.samplerate else 0.0
    if info.frames <= 0 and info.format == "MP3":  # some mp3s report no length: decode to count
        try:
            frames, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
            seconds = frames.shape[0] / float(rate)
        except Exception:  # noqa: BLE001
            raise invalid_request("audio", "audio: the mp3 does not decode") from None
    if seconds < MIN_SECONDS:
        raise invalid_request("audio", f"audio: {seconds:.2f} s; at least {MIN_SECONDS:g} s of speech is needed")
    if seconds > MAX_SECONDS:
        raise invalid_request("audio", f"audio: {seconds:.2f} s; at most {MAX_SECONDS:g} s")
    return seconds, int(info.samplerate), info.format


def _checked(name: str | None, consent: str | None, ref_text: str | None,
             speaker_description: str | None) -> tuple[str, str, str | None, str | None]:
    """An upload's text fields, checked (a 400 naming the field) and normalized."""
    name = check_name(name)
    if consent is None or not consent.strip() or consent.strip().lower() in REFUSALS or len(consent) > 256:
        raise invalid_request("consent", "consent: required; confirm that the speaker agreed to have their "
                                         "voice cloned (consent=true, or the id of their consent record)")
    if speaker_description is not None and not speaker_description.strip():
        speaker_description = None
    if speaker_description is not None and len(speaker_description) > 1024:
        raise invalid_request("speaker_description", "speaker_description: at most 1024 characters")
    if ref_text is not None and not ref_text.strip():
        ref_text = None
    if ref_text is not None and len(ref_text) > 4096:
        raise invalid_request("ref_text", "ref_text: at most 4096 characters")
    return name, consent.strip(), ref_text, speaker_description


class VoiceRegistry:
    """Voices on disk under ``root`` (module doc); thread-safe."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._voices: dict[str, RegisteredVoice] = {}
        self._data_urls: dict[str, str] = {}
        for folder in sorted(self.root.iterdir()):
            meta = folder / "voice.json"
            if folder.is_dir() and meta.is_file():
                try:
                    voice = RegisteredVoice(**json.loads(meta.read_text(encoding="utf-8")))
                except (TypeError, ValueError):
                    continue
                if (folder / voice.audio_file).is_file():
                    self._voices[voice.name] = voice

    def list(self) -> list[RegisteredVoice]:
        with self._lock:
            return [self._voices[n] for n in sorted(self._voices)]

    def get(self, name: str) -> RegisteredVoice | None:
        with self._lock:
            return self._voices.get((name or "").strip().lower())

    def add(self, name: str, audio: bytes, ref_text: str | None, consent: str | None,
            speaker_description: str | None = None) -> RegisteredVoice:
        name, consent, ref_text, speaker_description = _checked(name, consent, ref_text, speaker_description)
        seconds, rate, fmt = probe_audio(audio)
        ext = FORMATS[fmt][0]
        voice = RegisteredVoice(name=name, ref_text=ref_text, consent=consent, created_at=int(time.time()),
                                sha256=hashlib.sha256(audio).hexdigest(), bytes=len(audio),
                                duration_s=round(seconds, 3), sample_rate=rate, format=ext, audio_file=f"audio.{ext}",
                                speaker_description=speaker_description)
        return self._store(voice, audio)

    def add_embedding(self, name: str, embedding: Any, consent: str | None,
                      speaker_description: str | None = None) -> RegisteredVoice:
        """A voice that is a speaker embedding (module doc)."""
        name, consent, _, speaker_description = _checked(name, consent, None, speaker_description)
        values = parse_embedding(embedding)
        data = json.dumps(values).encode()
        voice = RegisteredVoice(name=name, ref_text=None, consent=consent, created_at=int(time.time()),
                                sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), duration_s=0.0,
                                sample_rate=0, format=EMBEDDING, audio_file="embedding.json",
                                speaker_description=speaker_description, embedding_dim=len(values))
        return self._store(voice, data)

    def embedding(self, voice: RegisteredVoice) -> list[float]:
        """The stored speaker embedding of an embedding voice."""
        return json.loads((self.root / voice.name / voice.audio_file).read_text(encoding="utf-8"))

    def _store(self, voice: RegisteredVoice, data: bytes) -> RegisteredVoice:
        name = voice.name
        with self._lock:
            if name in self._voices:
                raise invalid_request("name", f"name: a voice named {name!r} exists; delete it first",
                                      code="voice_exists")
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.root))
            (tmp / voice.audio_file).write_bytes(data)
            (tmp / "voice.json").write_text(json.dumps(asdict(voice), ensure_ascii=False, indent=1), encoding="utf-8")
            os.rename(tmp, self.root / name)
            self._voices[name] = voice
        return voice

    def remove(self, name: str) -> bool:
        name = (name or "").strip().lower()
        with self._lock:
            voice = self._voices.pop(name, None)
            self._data_urls.pop(name, None)
            if voice is None:
                return False
            target = self.root / name
            trash = Path(tempfile.mkdtemp(prefix=f".deleted-{name}-", dir=self.root))
            os.rename(target, trash / name)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def data_url(self, voice: RegisteredVoice) -> str:
        """The stored recording as a data URL (what Triton's `ref_audio` takes); cached."""
        with self._lock:
            url = self._data_urls.get(voice.name)
            if url is None:
                data = (self.root / voice.name / voice.audio_file).read_bytes()
                mime = next(m for e, m in FORMATS.values() if e == voice.format)
                url = f"data:{mime};base64," + base64.b64encode(data).decode("ascii")
                self._data_urls[voice.name] = url
            return url
