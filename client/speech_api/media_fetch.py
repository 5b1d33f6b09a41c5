"""Image and audio URLs a chat message (or a speech request's `ref_audio`) names, fetched only where
the operator allowed it (no SSRF).

By default the speech API fetches nothing: an `image_url` or `audio_url` must be a data URL, and
an http(s) URL is a 400 saying so. With `--fetch-allow-host HOST` (repeatable; `*.example.com`
matches subdomains) an http(s) URL on an allowed host is fetched and sent on as a data URL, within
limits: the host's addresses must be public (loopback, private, link-local, multicast and reserved
addresses are refused unless `--fetch-allow-private`), the answer must come within
`--fetch-timeout` seconds in all, be an `image/*` (an `audio/*` for audio) of at most
`--fetch-max-bytes`, after at most 3 redirects, each of which is checked again. Every refusal is a
400 naming the part (`messages[0].content[1].image_url.url`). An `audio_url` part (vLLM's) is then
sent on as the `input_audio` part the pipelines take. A speech request's `ref_audio` (vLLM-Omni's
takes a URL) follows the same rules (`fetch_ref_audio`), its refusals naming `ref_audio`.
"""
from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from client.speech_api.errors import ApiError, invalid_request

__all__ = ["FetchPolicy", "fetch_message_media", "fetch_ref_audio"]

MAX_REDIRECTS = 3


@dataclass(frozen=True)
class FetchPolicy:
    allowed_hosts: tuple[str, ...] = ()   # empty: fetching is off
    allow_private: bool = False
    max_bytes: int = 20 * 1024 * 1024
    timeout_s: float = 10.0

    @property
    def enabled(self) -> bool:
        return bool(self.allowed_hosts)

    def host_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for pattern in self.allowed_hosts:
            pattern = pattern.lower().rstrip(".")
            if host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:])):
                return True
        return False


class _Refused(Exception):
    pass


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    return not (ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_multicast or ip.is_reserved
                or ip.is_unspecified)


async def _check_host(url: str, policy: FetchPolicy) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise _Refused("must be a data URL or an http(s) URL")
    host = parts.hostname or ""
    if not host:
        raise _Refused("has no host")
    if not policy.host_allowed(host):
        raise _Refused(f"host {host!r} is not one this server fetches from (--fetch-allow-host)")
    if parts.username or parts.password:
        raise _Refused("must not carry credentials")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise _Refused(f"host {host!r} does not resolve") from None
    if not policy.allow_private and not all(_public(info[4][0]) for info in infos):
        raise _Refused(f"host {host!r} resolves to a private or loopback address")


# part type -> (the media type its URL must answer, what the refusal calls anything else)
_MEDIA = {"image_url": ("image/", "an image"), "audio_url": ("audio/", "audio")}


async def _fetch(url: str, policy: FetchPolicy, media: str = "image_url") -> tuple[bytes, str]:
    import httpx

    deadline = time.monotonic() + policy.timeout_s
    async with httpx.AsyncClient(follow_redirects=False, timeout=policy.timeout_s, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            await _check_host(url, policy)
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Refused(f"took longer than {policy.timeout_s:g} s")
            async with client.stream("GET", url, timeout=left) as response:
                if response.is_redirect:
                    url = urljoin(url, response.headers.get("location", ""))
                    continue
                if response.status_code != 200:
                    raise _Refused(f"answered HTTP {response.status_code}")
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                prefix, called = _MEDIA[media]
                if not kind.startswith(prefix):
                    raise _Refused(f"is not {called} (content-type {kind or 'missing'!r})")
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > policy.max_bytes:
                    raise _Refused(f"is larger than {policy.max_bytes} bytes")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > policy.max_bytes:
                        raise _Refused(f"is larger than {policy.max_bytes} bytes")
                    if time.monotonic() > deadline:
                        raise _Refused(f"took longer than {policy.timeout_s:g} s")
                return bytes(body), kind
        raise _Refused(f"redirects more than {MAX_REDIRECTS} times")


async def _resolve_part(part: dict[str, Any], where: str, policy: FetchPolicy) -> None:
    media = part["type"]
    spec = part[media]
    url = spec["url"].strip()
    if url.startswith("data:"):
        return
    field = f"{where}.{media}.url"
    example = "data:image/png;base64,..." if media == "image_url" else "data:audio/wav;base64,..."
    if urlsplit(url).scheme.lower() not in ("http", "https"):
        raise invalid_request(field, f"{field}: must be a data URL ({example}) or an http(s) URL")
    spec["url"] = await _data_url(url, field, media, policy)


async def fetch_ref_audio(body: Any, policy: FetchPolicy) -> None:
    """A speech body's http(s) `ref_audio` -> a data URL of what it names, in place, where the
    operator allowed its host (else a 400 naming `ref_audio`); any other value is left to the
    body's own checks."""
    value = body.get("ref_audio") if isinstance(body, dict) else None
    if isinstance(value, str) and urlsplit(value.strip()).scheme.lower() in ("http", "https"):
        body["ref_audio"] = await _data_url(value.strip(), "ref_audio", "audio_url", policy)


async def _data_url(url: str, field: str, media: str, policy: FetchPolicy) -> str:
    import httpx

    example = "data:image/png;base64,..." if media == "image_url" else "data:audio/wav;base64,..."
    if not policy.enabled:
        raise invalid_request(field, f"{field}: this server fetches no URL (send it as a data URL, {example})")
    try:
        body, kind = await asyncio.wait_for(_fetch(url, policy, media), policy.timeout_s + 1.0)
    except _Refused as refused:
        raise invalid_request(field, f"{field}: {refused}") from None
    except (asyncio.TimeoutError, httpx.TimeoutException):
        raise invalid_request(field, f"{field}: took longer than {policy.timeout_s:g} s") from None
    except ApiError:
        raise
    except Exception as error:   # connection refused, reset, TLS, a malformed answer
        raise invalid_request(field, f"{field}: could not be fetched ({type(error).__name__})") from None
    return f"data:{kind};base64,{base64.b64encode(body).decode()}"


async def fetch_message_media(messages: list[tuple[int, Any]], policy: FetchPolicy) -> tuple[str, ...]:
    """Replace each http(s) `image_url` or `audio_url` of ``messages`` (body index, content) by a
    data URL of what it names, and each `audio_url` by the `input_audio` part holding it, in place,
    or raise a 400 naming the part. Returns where the `audio_url` parts were."""
    converted = []
    for index, content in messages:
        if isinstance(content, str):
            continue
        for j, part in enumerate(content):
            where = f"messages[{index}].content[{j}]"
            if part.get("type") in _MEDIA:
                await _resolve_part(part, where, policy)
            if part.get("type") == "audio_url":   # the pipelines read a data URL as input_audio data
                url = part.pop("audio_url")["url"].strip()
                part.update(type="input_audio", input_audio={"data": url})
                converted.append(where)
    return tuple(converted)
