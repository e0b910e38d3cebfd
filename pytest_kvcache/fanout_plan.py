"""What crosses `~pytest_kvcache.fanout.Fanout`'s process boundary: the trial's and the sessions' plans and
results (`Trial`, `SessionPlan`, `SessionTurn`, `SessionTrial`, `ClientLoad`), the saturation limits, and
the jobs the parent sends each worker process (pickled). Plain Python: no pytest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_kvcache.client import Limits
from pytest_kvcache.sample import Sample

#: How often each worker's watchdog wakes: stall and timeout checks, and one event-loop lag sample.
TICK_S = 0.005


@dataclass(frozen=True)
class Saturation:
    """When a trial's client counts as saturated (its figures then describe the client, not the engine)."""

    #: a worker process busier than this share of one core over the trial's window
    max_cpu_share: float = 0.85
    #: the loop lag (`ClientLoad.loop_lag_p99_s`) above this: bytes that arrived waited about that long to be read
    max_loop_lag_s: float = 0.005
    #: a request sent this much after its requested time
    max_schedule_delay_s: float = 0.050


@dataclass
class ClientLoad:
    """How hard the client worked in one trial (one worker's figures, or the trial's worst)."""

    processes: int = 0
    streams: int = 0
    wall_s: float = 0.0
    #: CPU seconds of the worker processes in the window (all of them), and per chunk
    cpu_s: float = 0.0
    chunks: int = 0
    cpu_per_chunk_us: float | None = None
    #: the busiest worker's CPU over the window, as a share of one core
    cpu_share_max: float = 0.0
    #: CPU of the parsing after the window (SSE + JSON), in all and per chunk
    parse_cpu_s: float = 0.0
    parse_cpu_per_chunk_us: float | None = None
    #: how long a callback made ready waited for the loop (the I/O it had to handle first), per tick
    loop_lag_p50_s: float = 0.0
    loop_lag_p99_s: float = 0.0
    loop_lag_max_s: float = 0.0
    #: how late the tick's timer woke the loop (adds the host's scheduling delay; reported, not judged)
    timer_lag_p99_s: float = 0.0
    schedule_delay_p50_s: float = 0.0
    schedule_delay_max_s: float = 0.0
    saturated: bool = False
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Trial:
    """A trial's samples (in payload order) and the client's load while it ran."""

    samples: list[Sample]
    load: ClientLoad


@dataclass(frozen=True)
class SessionPlan:
    """One session's requests, as JSON pieces: turn ``k``'s body is ``head + turns[0] + … + turns[k] + tail``
    (the messages so far, each turn adding its own), so a turn's request is built by concatenation while the
    session thinks. ``think_s[k]`` is the wait before turn ``k`` (k ≥ 1) after turn ``k - 1`` ended; for
    ``k = 1`` it counts from the opening of the measured window instead (every session waits there after its
    warmup), which staggers the first measured turns. ``prompt_tokens[k]`` sizes turn ``k``'s first-token
    limit (estimated from its length when missing)."""

    head: bytes
    turns: tuple[bytes, ...]
    tail: bytes
    think_s: tuple[float, ...]
    prompt_tokens: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.turns or len(self.think_s) < len(self.turns):
            raise ValueError("a session plan needs at least one turn and a think time for every turn")


@dataclass
class SessionTurn:
    """One turn of one session: its sample; turn 0 is the session's warmup, the others were sent in the
    measured window."""

    session: int
    turn: int
    sample: Sample


@dataclass
class SessionTrial:
    """A sessions trial: every turn sent (in session, then turn order), the measured window (unix seconds;
    None when the sessions never all finished their warmup) and the client's load."""

    turns: list[SessionTurn]
    window_unix_s: tuple[float, float] | None
    load: ClientLoad

    @property
    def measured(self) -> list[SessionTurn]:
        return [t for t in self.turns if t.turn > 0]


#: A monitor of a sessions trial is told "start" when the measured window opens, "tick" every ``tick_s`` in
#: it, "end" when it closes and "done" when the last turn has ended.
Monitor = Callable[[str], None]


@dataclass
class _Job:
    """What a worker is told to run: its streams (index, request bytes, first-token limit, tokens, estimated)."""

    host: str
    port: int
    tls: bool
    streams: list[tuple[int, bytes, float, int, bool]]
    limits: Limits
    offsets_s: list[float]


@dataclass
class _SessionJob:
    """A worker's share of a sessions trial: its sessions (index, plan), where its warm time goes in the
    shared array, and the window's length."""

    host: str
    port: int
    tls: bool
    path: str
    headers: dict[str, str]
    sessions: list[tuple[int, SessionPlan]]
    limits: Limits
    window_s: float
    slot: int
    warm_concurrency: int
