"""Python-backend stub processes: what runs inside one (`stub_process`: orphan guard, heartbeat,
stall reports) and what other processes see of them (`server_stubs`: a server's stubs and their
shared memory; `unhealthy_stub`: killing a stub Triton called not healthy). Below both the Triton
glue (omni_backend/triton) and the supervisor (omni_backend/supervisor), which import it and
never each other."""
