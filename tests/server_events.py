"""A failed test's report shows what its servers' logs say went wrong: the supervisor's warnings
and errors (a stub killed, tritonserver restarted) and fatal signs from tritonserver and its stubs.
A server that crashed under a test otherwise shows only as "connection refused" in the next one,
and on CI the logs are gone with the run's temporary folder."""
from __future__ import annotations

import re

import pytest

from client.service_process import ServiceProcess

EVENT = re.compile(r"\[supervisor\] (WARNING|ERROR)|Signal \(\d+\) received|corrupt|double free|malloc\(\)|"
                   r"malloc_consolidate|Segmentation fault|terminate called|core dumped|Killed")
MAX_LINES = 40


def server_events(process: ServiceProcess, max_lines: int = MAX_LINES) -> str:
    """The last `max_lines` event lines of one server's log ('' when there are none)."""
    lines = [line for line in process.log_text().splitlines() if EVENT.search(line)]
    return "\n".join(lines[-max_lines:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for process in ServiceProcess.live():
        events = server_events(process)
        if events:
            report.sections.append((f"{process.name} events ({process.log_path})", events))
