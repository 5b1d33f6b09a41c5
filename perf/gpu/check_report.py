"""What every part of the GPU check shares: a SIGTERM (check.sh's timeout) that stops the
measuring but not the report, and the report's end (problems line, print, append)."""
from __future__ import annotations

import signal


class Stopped(Exception):
    """SIGTERM (check.sh's timeout): the report is still printed and written."""


def _stop(signum, frame) -> None:
    raise Stopped("stopped by SIGTERM (timeout)")


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises :class:`Stopped` in the main thread."""
    signal.signal(signal.SIGTERM, _stop)


def finish(head: str, lines: list[str], problems: list[str], results: str, no_results: bool) -> int:
    """Print the report (with a Problems line if any), append it to `results` unless
    `no_results`; the exit status: 1 when there was a problem."""
    text = head + "\n".join(lines) + "\n"
    if problems:
        text += f"\n**Problems: {'; '.join(problems)}**\n"
    print(text)
    if not no_results:
        with open(results, "a") as f:
            f.write("\n" + text)
    return 1 if problems else 0
