"""API keys: `OMNI_API_KEYS` (comma or space separated) and/or `--api-key`. When any key is set,
every `/v1/*` request needs `Authorization: Bearer <key>`; the page and `/health` stay open."""
from __future__ import annotations

import hmac
import os
import re

from client.speech_api.errors import unauthorized

ENV_VAR = "OMNI_API_KEYS"


def load_api_keys(flag_keys: list[str] | None = None, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    environ = os.environ if environ is None else environ
    keys = [k for k in re.split(r"[,\s]+", environ.get(ENV_VAR, "")) if k]
    keys += [k.strip() for k in flag_keys or [] if k.strip()]
    return tuple(dict.fromkeys(keys))


class ApiKeys:
    def __init__(self, keys: tuple[str, ...]):
        self.keys = tuple(k.encode() for k in keys)

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def check(self, authorization: str | None) -> None:
        if not self.keys:
            return
        if not authorization:
            raise unauthorized("Missing API key: send the header Authorization: Bearer <key>")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise unauthorized("Malformed Authorization header: use Authorization: Bearer <key>")
        given = token.strip().encode()
        # compare against every key, always, so timing does not tell which one nearly matched
        ok = False
        for key in self.keys:
            ok |= hmac.compare_digest(given, key)
        if not ok:
            raise unauthorized("Incorrect API key provided")
