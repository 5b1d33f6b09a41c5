"""Command line of the supervisor: tritonserver's own flags, passed through, plus
`--supervisor-*` flags of its own (removed before tritonserver sees them).

Flags the supervision needs are added unless given: explicit model control with every model
loaded at start (so one pipeline can be reloaded while the others serve), strict readiness (a
pipeline being reloaded makes the server not ready), and a short exit timeout (the supervisor
drains streams before it stops the server).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

# tritonserver's own defaults, which the supervisor, the launchers and the cluster manifests
# (deploy/k8s, checked by tests/unit/test_k8s_manifests.py) all take from here
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
LIVE_PATH = "/v2/health/live"     # the process serves HTTP
READY_PATH = "/v2/health/ready"   # strict readiness: every model loaded (false while a pipeline reloads)
# how long one drain or abort request may take on SIGTERM (supervisor.py `_shutdown`)
SHUTDOWN_CONTROL_SECS = 2.0


@dataclass
class SupervisorOptions:
    heal: bool = True                   # reload a pipeline whose stage died or stopped answering
    restart: bool = True                # start tritonserver again when it exits by itself
    # an entry that died or froze holding client streams: restart tritonserver so that they end
    # (2.51 keeps them open for ever); false: reload its pipeline, those clients wait for their timeout
    restart_on_lost_streams: bool = True
    probe_interval_secs: float = 1.0    # how often every pipeline is pinged
    ping_timeout_secs: float = 3.0
    stalled_secs: float = 20.0          # a stub whose heartbeat is this old is stuck: reloaded
    # sooner, a stub whose heartbeat is this old while none of its threads ran or waited for a CPU
    # and the host was not starved (supervisor.py `_blocked`)
    frozen_secs: float = 3.0
    unresponsive_secs: float = 120.0    # pings unanswered this long while the pipeline does nothing
    # a start that is not ready this long after it began: its loading stubs' stacks are logged,
    # and it is killed and started again (a stub can hang in its start-up on a starved host)
    start_timeout_secs: float = 600.0
    drain_secs: float = 4.0             # SIGTERM: how long running streams may go on
    stop_secs: float = 4.0              # then how long tritonserver has to exit before SIGKILL
    server_args: list[str] = field(default_factory=list)

    def flag(self, name: str, default: str | None = None) -> str | None:
        """The value of a tritonserver flag (`--name=value` or `--name value`)."""
        args = self.server_args
        for i, arg in enumerate(args):
            if arg.startswith(f"--{name}="):
                return arg.split("=", 1)[1]
            if arg == f"--{name}" and i + 1 < len(args):
                return args[i + 1]
        return default

    def _local_host(self, address_flag: str, fallback: str | None = None) -> str:
        """Where this host reaches a server bound by `--<address_flag>`: localhost unless it is
        bound to one address only (a pod's, or one loopback address of several)."""
        address = self.flag(address_flag) or (self.flag(fallback) if fallback else None)
        if address in (None, "", "0.0.0.0", "::", "[::]"):
            return "localhost"
        return f"[{address}]" if ":" in address and not address.startswith("[") else address

    @property
    def grpc_url(self) -> str:
        return f"{self._local_host('grpc-address')}:{self.flag('grpc-port', str(GRPC_PORT))}"

    @property
    def metrics_url(self) -> str | None:
        if (self.flag("allow-metrics", "true") or "").lower() in ("false", "0", "no"):
            return None
        # tritonserver binds metrics to --http-address unless --metrics-address is given
        host = self._local_host("metrics-address", "http-address")
        return f"http://{host}:{self.flag('metrics-port', str(METRICS_PORT))}/metrics"

    @property
    def shutdown_secs(self) -> float:
        """The longest a SIGTERM takes from the signal to a stopped server (`_shutdown`): the drain
        (at least its requests' time), the aborts of the streams left, tritonserver's own exit,
        then its kill."""
        control = SHUTDOWN_CONTROL_SECS + 0.5   # a control request's timeout, and its wait on top
        return max(self.drain_secs, control) + control + self.stop_secs + 1.0

    @property
    def explicit_models(self) -> bool:
        return (self.flag("model-control-mode") or "").lower() == "explicit"


MIN_FROZEN_SECS = 2.0


class UsageError(ValueError):
    pass


def _value(name: str, raw: str, kind: type):
    if kind is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise UsageError(f"--supervisor-{name}: expected true or false, got {raw!r}")
    try:
        value = kind(raw)
    except ValueError:
        raise UsageError(f"--supervisor-{name}: expected a number, got {raw!r}") from None
    if value <= 0:
        raise UsageError(f"--supervisor-{name}: must be > 0, got {raw!r}")
    return value


def parse(argv: list[str]) -> SupervisorOptions:
    opts = SupervisorOptions()
    kinds = {f.name.replace("_", "-"): type(getattr(opts, f.name)) for f in fields(opts) if f.name != "server_args"}
    rest: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("--supervisor-"):
            rest.append(arg)
            continue
        name, sep, raw = arg[len("--supervisor-"):].partition("=")
        if name not in kinds:
            raise UsageError(f"--supervisor-{name}: unknown flag; known: "
                             + ", ".join(f"--supervisor-{k}" for k in kinds))
        if not sep:
            if not args:
                raise UsageError(f"--supervisor-{name}: needs a value")
            raw = args.pop(0)
        setattr(opts, name.replace("-", "_"), _value(name, raw, kinds[name]))
    opts.server_args = rest
    if opts.frozen_secs < MIN_FROZEN_SECS:
        # the supervisor samples a late stub's threads from 1 s on and needs a window after that
        raise UsageError(f"--supervisor-frozen-secs: at least {MIN_FROZEN_SECS}, got {opts.frozen_secs}")
    if opts.flag("model-repository") is None and opts.flag("model-store") is None:
        raise UsageError("--model-repository is required")
    if opts.flag("model-control-mode") is None:
        rest += ["--model-control-mode=explicit", "--load-model=*"]
    if opts.flag("strict-readiness") is None:
        rest.append("--strict-readiness=true")
    if opts.flag("exit-timeout-secs") is None:
        rest.append("--exit-timeout-secs=3")
    return opts
