"""What a run writes line by line: request records and their samples, agreement, fidelity and sampling
records (``requests.jsonl`` and its side logs; docs/records.md)."""

from __future__ import annotations

from typing import TypedDict

from pytest_kvcache.model.base import Json


class SampleData(TypedDict, total=False):
    """:class:`~pytest_kvcache.sample.Sample` as written (``Sample.to_dict``)."""

    ok: bool
    error_kind: str | None
    error: str | None
    http_status: int | None
    send_unix_s: float
    send_perf_s: float
    first_token_s: float | None
    last_token_s: float | None
    end_s: float | None
    chunks: int
    token_chunks: int
    first_chunk_tokens: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    requested_tokens: int | None
    promised_tokens: int | None
    streamed_tokens: int | None
    finish_reason: str | None
    token_clock: str | None
    content_chars: int
    text: str
    tool_calls: list[dict[str, str]]


class OfBoot(TypedDict, total=False):
    """Where a line of a run's records comes from: the run, the arm, the boot and its replicate, the test."""

    run_id: str
    arm: str
    boot: str
    replicate: int
    test: str


class Record(OfBoot, total=False):
    """One line of ``requests.jsonl`` (docs/records.md). The first block is always there; the rest is the
    probe's context (``depth``, ``turn``, ``engine`` counter deltas, ``gpu`` window, ``cold_proof`` …)."""

    schema_version: int
    probe: str | None
    shape: str | None
    depth: int | None
    turn: int | None
    session: int | None
    phase: str | None
    index: int | None
    ok: bool
    flags: list[str]
    excluded_reason: str | None
    voided: dict[str, str]
    error_kind: str | None
    error: str | None
    metrics: dict[str, float | None]
    sample: SampleData
    engine: dict[str, Json] | None
    gpu: dict[str, Json] | None
    host_cpu: dict[str, Json] | None
    cold_proof: Json
    prompt_sha256: str
    sizing: dict[str, Json]
    tool_call: dict[str, Json]
    streams: int
    concurrency: int
    #: the many-stream client's load over the trial (concurrency probe; `pytest_kvcache.fanout.ClientLoad`)
    client: dict[str, Json]
    #: the capacity probe's trial this turn belongs to: sessions, SLO, window, the engine's counters over the
    #: window (`report.capacity` reads it)
    capacity: dict[str, Json]


class AgreementRecord(TypedDict, total=False):
    """One line of ``agreement.jsonl``: greedy token ids of one unmeasured request."""

    arm: str | None
    boot: str
    replicate: int
    shape: str
    index: int
    test: str
    ok: bool
    ids: list[int]
    logprobs: list[float]
    #: the generated text (the report shows where two arms' greedy texts diverge)
    text: str
    error: str
    send_unix_s: float
    wall_s: float


class FidelityWindowData(TypedDict):
    """The positions one scored prompt keeps at one depth (``probes.fidelity.Window``)."""

    depth: int
    start: int
    ids: list[int]
    logprob: list[float]
    top_ids: list[list[int]]
    top_logprobs: list[list[float]]


class FidelityRecord(OfBoot, total=False):
    """One line of ``fidelity.jsonl``: one text scored teacher-forced on one boot (prompt logprobs)."""

    text: str
    text_sha256: str
    ids_sha256: str
    prompt_tokens: int
    top_k: int
    window: int
    windows: list[FidelityWindowData]
    short_depths: list[int]
    engine: dict[str, Json] | None
    cold_proof: str
    flags: list[str]
    excluded_reason: str | None
    wall_s: float
    ok: bool
    error: str
    #: how it was scored when not by one prompt-logprobs request (llama-server: forced continuations)
    method: str
    #: for "can this baseline judge?" (``probes.judging``): the whole text's characters and tokens, the served
    #: model's vocabulary (None: unknown), a short greedy continuation at the first depth (or why there is none)
    text_chars: int
    text_tokens: int
    vocab_size: int | None
    greedy_text: str
    greedy_error: str


class RetrievalRecord(OfBoot, total=False):
    """One line of ``retrieval.jsonl``: one needle asked on one boot (``probes.retrieval``). The same needles
    (from the run seed) go to every arm, so ``cell`` + ``needle`` pair a request across arms."""

    #: the cell: exact prompt tokens, the needle's position as a share of the context (0.1 = 10%), the form
    #: (``recall``: a completion ending with the needle's lead-in; ``question``: a chat question) and how many
    #: needles the haystack holds (1: single; K > 1: multi-key, one asked)
    depth: int
    position: float
    form: str
    keys: int
    haystack: str
    #: the needle's index within its cell (0 … needles − 1), its kind (``number`` or ``words``), its key
    needle: int
    kind: str
    key: str
    expected: str
    returned: str
    correct: bool
    #: the prompt's tokens as sent (exact by construction for ``recall``; the server's count for ``question``)
    prompt_tokens: int
    #: the token index the asked needle starts at
    needle_at: int
    wall_s: float
    ok: bool
    error: str


class SamplingRecord(TypedDict, total=False):
    """One line of ``sampling.jsonl``: why an adaptive loop (requests, or rounds of boots) stopped."""

    kind: str
    round: int
    rounds_done: int
    target_pct: float
    widest: dict[str, Json] | None
    decision: str
    reason: str
    boot: str
    arm: str
    test: str
    probe: str
    point: str
