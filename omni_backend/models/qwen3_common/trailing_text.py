"""The text-channel rows a request feeds the talker, one per generated frame.

In streaming-text mode the talker's input at frame ``t`` is the frame's codebook embeddings plus
text row ``t``: the text ids after the first, then ``tts_eos``, then ``tts_pad`` for ever. When
the text arrives in pieces the rows grow as its ids become final (``extend``) and ``tts_eos``
comes only with the end of the input (``close``); until then a frame whose row has not arrived
cannot be made (``has_row``), and its request waits.
"""
from __future__ import annotations

import torch

__all__ = ["TrailingText"]


class TrailingText:
    def __init__(self, rows: torch.Tensor, tts_pad: torch.Tensor, closed: bool = True,
                 tts_eos: torch.Tensor | None = None) -> None:
        """``rows`` ``[T, hidden]``; ``tts_pad`` ``[1, hidden]``; an open text (``closed=False``)
        needs ``tts_eos`` ``[1, hidden]`` for its end."""
        if not closed and tts_eos is None:
            raise ValueError("an open text needs tts_eos for its end")
        self._rows: list[torch.Tensor] = _split_rows(rows)
        self.tts_pad = tts_pad
        self.tts_eos = tts_eos
        self.closed = closed

    def __len__(self) -> int:
        return len(self._rows)

    def has_row(self, frame: int) -> bool:
        return frame < len(self._rows) or self.closed

    def row(self, frame: int) -> torch.Tensor:
        """Text row of ``frame`` ``[1, hidden]`` (``tts_pad`` past the end of a closed text)."""
        if frame < len(self._rows):
            return self._rows[frame]
        if not self.closed:
            raise IndexError(f"text row {frame} has not arrived yet")
        return self.tts_pad

    def extend(self, rows: torch.Tensor) -> None:
        """More rows ``[k, hidden]`` of an open text."""
        if self.closed:
            raise ValueError("the text is closed")
        self._rows.extend(_split_rows(rows))

    def close(self) -> None:
        """The input ended: ``tts_eos`` is the last row, ``tts_pad`` follows."""
        if not self.closed:
            self._rows.append(self.tts_eos)
            self.closed = True


def _split_rows(rows: torch.Tensor) -> list[torch.Tensor]:
    """``[k, hidden]`` -> k views ``[1, hidden]`` (torch's split of an empty tensor gives one empty piece)."""
    return list(rows.split(1, dim=0)) if rows.shape[0] else []
