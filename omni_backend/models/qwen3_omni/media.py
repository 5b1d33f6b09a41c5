"""Media parts of a chat message (OpenAI's content parts) -> what the thinker's encoders read.

``{"type": "input_audio", "input_audio": {"data": <base64>, "format": "wav" | "mp3" | "flac" | ...}}``
is decoded (libsndfile), mixed to mono and resampled to the feature extractor's rate (16 kHz for
the released checkpoints; polyphase, scipy). A recording the server cannot read, one that is empty,
too short for one feature frame or longer than :attr:`AudioLimits.max_seconds` is an
``invalid_request`` naming the part (``messages[2].content[0].input_audio``).

``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` is decoded with PIL
(PNG, JPEG, WebP, GIF, BMP; its first frame), within :class:`ImageLimits` (encoded bytes, decoded
pixels: a decompression bomb is refused before it is decoded). The server fetches no URL a client
names: an http(s) URL is refused with a message that says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from omni_backend.errors import InvalidRequest
from omni_backend.reference_audio import ReferenceAudioLimits, decode_reference_audio, resample

__all__ = ["AudioLimits", "AUDIO_FORMATS", "Recording", "decode_input_audio", "MEDIA_PART_TYPES", "ImageLimits",
           "decode_image_url", "open_image"]

# What OpenAI's `input_audio.format` may name; libsndfile reads each (mp3 from libsndfile 1.1).
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "opus")
MEDIA_PART_TYPES = ("input_audio", "image_url")


@dataclass(frozen=True)
class AudioLimits:
    max_seconds: float = 120.0            # per recording
    max_bytes: int = 24 * 1024 * 1024     # per recording, decoded from base64
    max_recordings: int = 16              # per request (the whole conversation)


@dataclass(frozen=True)
class Recording:
    """A decoded recording at the feature extractor's rate."""

    waveform: np.ndarray   # float32 [samples], mono
    source_rate: int

    @property
    def samples(self) -> int:
        return int(self.waveform.shape[0])


def decode_input_audio(part: Mapping[str, Any], where: str, sampling_rate: int, hop_length: int,
                       limits: AudioLimits = AudioLimits()) -> Recording:
    """An ``input_audio`` part -> :class:`Recording` at ``sampling_rate``; ``where`` names the part."""
    spec = part.get("input_audio")
    field = f"{where}.input_audio"
    if not isinstance(spec, Mapping):
        raise InvalidRequest(field, "must be an object {data: base64 audio, format: wav | mp3 | flac | ...}")
    unknown = sorted(set(spec) - {"data", "format"})
    if unknown:
        raise InvalidRequest(f"{field}.{unknown[0]}", "unknown field (input_audio takes data and format)")
    fmt = spec.get("format")
    if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in AUDIO_FORMATS):
        raise InvalidRequest(f"{field}.format", f"must be one of {', '.join(AUDIO_FORMATS)}")
    data = spec.get("data")
    if not isinstance(data, str) or not data.strip():
        raise InvalidRequest(f"{field}.data", "must be base64 audio (or a data URL)")
    min_seconds = hop_length / float(sampling_rate)
    audio, rate = decode_reference_audio(
        data, f"{field}.data", ReferenceAudioLimits(min_seconds=min_seconds, max_seconds=limits.max_seconds,
                                                    max_bytes=limits.max_bytes))
    return Recording(resample(audio, rate, sampling_rate), rate)


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = 20 * 1024 * 1024       # per image, encoded
    max_pixels: int = 40_000_000            # per image, decoded (before the processor's resize)
    max_images: int = 16                    # per request (the whole conversation)


IMAGE_MEDIA_TYPES = ("image/png", "image/jpeg", "image/jpg", "image/webp", "image/gif", "image/bmp")


def decode_image_url(part: Mapping[str, Any], where: str, limits: ImageLimits = ImageLimits()):
    """An ``image_url`` part holding a ``data:image/...;base64,`` URL -> a PIL image (its first
    frame). Other URLs are the caller's to fetch (:mod:`.media_fetch`); here they are refused."""
    import base64
    import binascii

    spec = part.get("image_url")
    field = f"{where}.image_url"
    if isinstance(spec, str):
        spec = {"url": spec}
    if not isinstance(spec, Mapping):
        raise InvalidRequest(field, "must be an object {url: a data URL (data:image/png;base64,...)}")
    unknown = sorted(set(spec) - {"url", "detail"})
    if unknown:
        raise InvalidRequest(f"{field}.{unknown[0]}", "unknown field (image_url takes url and detail)")
    if spec.get("detail") not in (None, "auto", "low", "high"):
        raise InvalidRequest(f"{field}.detail", "must be auto, low or high")
    url = spec.get("url")
    if not isinstance(url, str) or not url.strip():
        raise InvalidRequest(f"{field}.url", "must be a data URL (data:image/png;base64,...)")
    url = url.strip()
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        what = "URLs this server does not fetch" if scheme in ("http", "https") else "not an image URL"
        raise InvalidRequest(f"{field}.url", f"{what}; send the image as a data URL (data:image/png;base64,...)")
    head, _, data = url.partition(",")
    media_type = head[5:].split(";")[0].lower()
    if ";base64" not in head or media_type not in IMAGE_MEDIA_TYPES:
        raise InvalidRequest(f"{field}.url", f"must be a base64 data URL of an image ({', '.join(IMAGE_MEDIA_TYPES)})")
    if len(data) > limits.max_bytes * 4 // 3 + 8:
        raise InvalidRequest(f"{field}.url", f"too large (the limit is {limits.max_bytes} bytes)")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{field}.url", "is not valid base64") from None
    return open_image(raw, f"{field}.url", limits)


def open_image(raw: bytes, field: str, limits: ImageLimits = ImageLimits()):
    """Encoded image bytes -> a loaded PIL image, within ``limits``; errors name ``field``."""
    import io
    import warnings

    from PIL import Image

    if len(raw) > limits.max_bytes:
        raise InvalidRequest(field, f"too large ({len(raw)} bytes; the limit is {limits.max_bytes})")
    if not raw:
        raise InvalidRequest(field, "is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw))
            width, height = image.size
            if width * height > limits.max_pixels:
                raise InvalidRequest(field, f"too large ({width}x{height} pixels; the limit is {limits.max_pixels})")
            image.load()
    except InvalidRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):   # PIL's own size check, at open
        raise InvalidRequest(field, f"too large (over {Image.MAX_IMAGE_PIXELS} pixels; the limit is "
                                    f"{limits.max_pixels})") from None
    except Exception:  # PIL says "cannot identify image file", a truncated stream
        raise InvalidRequest(field, "is not an image this server can read (PNG, JPEG, WebP, GIF, BMP)") from None
    if min(image.size) < 1 or max(image.size) / min(image.size) > 200:
        raise InvalidRequest(field, f"has an aspect ratio over 200 ({width}x{height})")
    return image
