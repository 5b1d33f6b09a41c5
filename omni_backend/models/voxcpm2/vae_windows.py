"""VoxCPM2's edge lm -> vae: latent patches cut into stateless decoder windows.

The lm stage streams LATENTS [frames, D] (latent frames, ``P`` per patch); its first response
starts with the cloning recording's last patches (CONTEXT = their frame count, 0 otherwise), which
the reference decodes before the new ones and cuts (non-streaming ``generate``). Windows: the
first after ``initial_chunk_frames`` patches, then every ``chunk_frames`` patches (and the rest at
the end, whenever the lm finishes), each with up to ``left_context_frames`` patches of left
context (deploy ``async_chunk``; it must cover the decoder's reach,
:func:`.audio_vae.decoder_left_context`). The vae stage returns only the new frames' audio, so the
chunks join to the reference's whole decode.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import numpy as np

from omni_backend.triton.transfer import Outputs, SourceReader, StageCall, Transfer


class VAEWindows(Transfer):
    async def run(self, request: dict[str, Any], sources: dict[int, AsyncIterator[Outputs]],
                  stage: StageCall) -> AsyncIterator[Outputs]:
        (source,) = sources.values()
        chunk = self.deploy.async_chunk
        frames: list[np.ndarray] = []          # [n, D] pieces, context first
        state = {"context": None, "total": 0, "patch": None}

        def arrived(out: Outputs) -> None:
            latents = np.asarray(out["LATENTS"], dtype=np.float32)
            if state["context"] is None:
                state["context"] = int(np.asarray(out["CONTEXT"]).reshape(-1)[0])
                state["patch"] = int(np.asarray(out["PATCH_SIZE"]).reshape(-1)[0])
            frames.append(latents.reshape(-1, latents.shape[-1]))
            state["total"] += latents.reshape(-1, latents.shape[-1]).shape[0]

        reader = SourceReader(source, arrived)
        done = None          # frames already decoded (context counts as decoded)
        try:
            while True:
                if done is None and state["context"] is not None:
                    done = state["context"]
                if done is not None:
                    p = state["patch"]
                    new_patches = (state["total"] - done) // p
                    first = done == state["context"]
                    want = chunk.initial_chunk_frames if first else chunk.chunk_frames
                    # cuts depend on the patch count only, never on whether the lm has finished
                    # yet: a window's length changes its audio's float rounding, so a request's
                    # audio would depend on timing (full chunks first, then the rest)
                    if new_patches >= want or (reader.finished and state["total"] > done):
                        take = want * p if new_patches >= want else state["total"] - done
                        seq = np.concatenate(frames) if len(frames) > 1 else frames[0]
                        frames[:] = [seq]
                        left = min(chunk.left_context_frames * p, done)
                        window = seq[done - left:done + take].T
                        answer = await stage.call({"LATENTS": window[None].astype(np.float32),
                                                   "LEFT_CONTEXT": np.asarray([[left]], dtype=np.int32)})
                        done += take
                        yield {"AUDIO": answer["AUDIO"].reshape(-1)}
                        continue
                if reader.finished:
                    reader.check()
                    return
                await reader.more(stage, lambda: False)
        finally:
            await reader.aclose()
