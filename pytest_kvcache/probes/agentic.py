"""Agentic decode-at-depth: a coding-assistant session replayed turn by turn as its context grows.

``replay`` (default): turn k's prompt is the fixture's system prompt, tools and turns 1..k-1 (user
message, the fixture's assistant tool call, the fixture's tool result) plus turn k's user message —
byte-identical in every arm, decoded greedy with ``ignore_eos``. ``live`` reproduces the seed: the
model's own reply and tool calls are appended (``tool_choice: required``, temperature 0.3), a call is
synthesized from the fixture when none came, and each such miss is counted.

A session salt (from the run seed and the session number) opens the system prompt, so session 2 cannot
hit session 1's prefix cache; within a session, cache hits across turns are the point, and measured.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_kvcache.probes.prefill import salt_for

FIXTURE_NAME = "session-v1.json"
TURN_KEYS = ("user", "tool", "arguments", "assistant", "result")


class FixtureError(ValueError):
    """The agentic fixture is missing or malformed; the message names the file and the field."""


def default_fixture() -> Path:
    return Path(str(resources.files("pytest_kvcache") / "data" / "agentic" / FIXTURE_NAME))


@dataclass(frozen=True)
class Turn:
    user: str
    tool: str
    arguments: dict[str, Any]
    assistant: str
    result: str


@dataclass(frozen=True)
class Session:
    path: Path
    sha256: str
    system_prompt: str
    tools: list[dict[str, Any]]
    turns: tuple[Turn, ...]
    #: a scaled session (``scaled``): the factor its tool results were scaled by, and the stock fixture's sha256
    scale: float = 1.0
    stock_sha256: str | None = None


def load(path: Path | None = None) -> Session:
    """Load and validate the fixture; its bytes must match the sha256 committed beside it."""
    path = path or default_fixture()
    try:
        data_bytes = path.read_bytes()
    except OSError as exc:
        raise FixtureError(f"{path}: cannot read the agentic fixture ({exc.strerror})") from None
    digest = hashlib.sha256(data_bytes).hexdigest()
    sha_file = path.with_name(path.name + ".sha256")
    if sha_file.exists():
        recorded = sha_file.read_text().split()[0] if sha_file.read_text().split() else ""
        if recorded != digest:
            raise FixtureError(
                f"{path}: content sha256 {digest[:12]}… differs from the recorded {recorded[:12]}… in "
                f"{sha_file.name}: a changed fixture must be a new version, not an edit"
            )
    try:
        data = json.loads(data_bytes)
    except json.JSONDecodeError as exc:
        raise FixtureError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise FixtureError(f"{path}: the top level must be an object")
    for key, kind in (("system_prompt", str), ("tools", list), ("turns", list)):
        if not isinstance(data.get(key), kind):
            raise FixtureError(f"{path}: field {key!r} is missing or not a {kind.__name__}")
    turns = []
    for i, raw in enumerate(data["turns"], 1):
        if not isinstance(raw, dict):
            raise FixtureError(f"{path}: turns[{i}] must be an object")
        for key in TURN_KEYS:
            if key not in raw:
                raise FixtureError(f"{path}: turns[{i}] has no field {key!r}")
        if not isinstance(raw["arguments"], dict):
            raise FixtureError(f"{path}: turns[{i}].arguments must be an object")
        turns.append(Turn(**{k: raw[k] for k in TURN_KEYS}))
    if not turns:
        raise FixtureError(f"{path}: field 'turns' is empty")
    return Session(path, digest, data["system_prompt"], data["tools"], tuple(turns))


# ------------------------------------------------------------------------------ a session for any context


class FitError(ValueError):
    """No scaling of the tool results makes the session's last turn reach the target (its fixed part is
    already longer)."""


def scale_text(text: str, factor: float) -> str:
    """``text`` cut (factor < 1) or repeated (factor > 1) to ``round(len × factor)`` characters."""
    n = round(len(text) * factor)
    if n <= 0 or not text:
        return ""
    return (text * -(-n // len(text)))[:n]


def scaled(session: Session, factor: float) -> Session:
    """``session`` with every tool result scaled by ``factor``: the same turns, each turn's growth scaled
    alike (the system prompt, tools, user messages and tool calls stay). Its sha256 is that of the scaled
    content, so records name exactly the prompts they sent."""
    stock = session.stock_sha256 or session.sha256
    base_turns = session.turns
    if factor == 1.0:
        return session
    turns = tuple(replace(t, result=scale_text(t.result, factor)) for t in base_turns)
    content = {
        "system_prompt": session.system_prompt,
        "tools": session.tools,
        "turns": [asdict(t) for t in turns],
        "scaled_from": stock,
        "scale": factor,
    }
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    return Session(session.path, digest, session.system_prompt, session.tools, turns, factor, stock)


def turn_body(session: Session, turn_no: int, session_no: int, seed: int) -> dict[str, Any]:
    """What decides turn ``turn_no``'s prompt in replay (messages and tools): what a counter counts."""
    conversation = Conversation.start(session, session_no, seed)
    for earlier in range(1, turn_no):
        conversation.ask(earlier)
        conversation.answer(earlier)
    return {"messages": conversation.ask(turn_no), "tools": session.tools}


def fit(
    session: Session,
    count: Callable[[Mapping[str, Any]], int],
    target: int,
    *,
    last_turn: int,
    session_no: int,
    seed: int,
    grow: bool,
) -> tuple[Session, int]:
    """The session scaled so that turn ``last_turn``'s prompt is at most ``target`` tokens, as close to it
    as bisection over the scale factor gets (12 steps: within 0.03% of the stock result lengths), and that
    prompt's tokens. ``grow`` False (``--kv-agentic-depth=fit``): a session that fits already is left as
    it is. ``count`` counts a chat body's prompt tokens as the server will."""

    def tokens(factor: float) -> int:
        return count(turn_body(scaled(session, factor), last_turn, session_no, seed))

    full = tokens(1.0)
    if full == target or (full < target and not grow):
        return session, full
    lo, hi = (0.0, 1.0) if full > target else (1.0, 2.0)
    if full < target:
        while tokens(hi) <= target:
            lo, hi = hi, hi * 2
            if hi > 1024:
                raise FitError(f"the agentic fixture cannot grow to {target:,} tokens")
    for _ in range(12):
        mid = round((lo + hi) / 2, 6)
        if tokens(mid) <= target:
            lo = mid
        else:
            hi = mid
    found = tokens(lo)
    if found > target:
        raise FitError(
            f"turn {last_turn} of the agentic fixture has {found:,} prompt tokens without any tool result: "
            f"more than the {target:,} it may have"
        )
    return scaled(session, lo), found


def call_id(session_no: int, turn_no: int) -> str:
    return f"call_s{session_no}t{turn_no}"


def fixture_tool_call(turn: Turn, session_no: int, turn_no: int) -> dict[str, Any]:
    return {
        "id": call_id(session_no, turn_no),
        "type": "function",
        "function": {"name": turn.tool, "arguments": json.dumps(turn.arguments, sort_keys=True)},
    }


@dataclass
class Conversation:
    """The messages of one session, grown turn by turn."""

    session: Session
    session_no: int
    salt: str
    messages: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, session: Session, session_no: int, seed: int) -> Conversation:
        salt = salt_for(seed, "agentic", session_no)
        system = f"Session {salt}. {session.system_prompt}"
        return cls(session, session_no, salt, [{"role": "system", "content": system}])

    def ask(self, turn_no: int) -> list[dict[str, Any]]:
        """Append turn ``turn_no``'s user message (1-based); returns the messages to send."""
        self.messages.append({"role": "user", "content": self.session.turns[turn_no - 1].user})
        return list(self.messages)

    def answer(self, turn_no: int, tool_calls: list[dict[str, Any]] | None = None, text: str = "") -> bool:
        """Append the assistant turn and the tool result. Returns True when the fixture's call was used.

        ``tool_calls`` (live mode) are the model's calls; None (replay) or an empty list (a live miss)
        appends the fixture's own call.
        """
        turn = self.session.turns[turn_no - 1]
        used_fixture = not tool_calls
        if used_fixture:
            calls = [fixture_tool_call(turn, self.session_no, turn_no)]
            content = turn.assistant if tool_calls is None else text
        else:
            calls = []
            for i, call in enumerate(tool_calls or []):
                calls.append(
                    {
                        "id": f"{call_id(self.session_no, turn_no)}_{i}",
                        "type": "function",
                        "function": {"name": call.get("name", ""), "arguments": call.get("arguments") or "{}"},
                    }
                )
            content = text
        self.messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        for call in calls:
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": turn.result})
        return used_fixture

    def payload(self, model: str, mode: str, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": list(self.messages),
            "tools": self.session.tools,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_tokens": max_tokens,
        }
        if mode == "replay":
            body.update({"temperature": 0.0, "ignore_eos": True, "min_tokens": max_tokens, "tool_choice": "none"})
        else:
            body.update({"temperature": 0.3, "tool_choice": "required"})
        return body


def prompt_sha256(payload: dict[str, Any]) -> str:
    """Hash of what decides the prompt (messages and tools): equal across arms in replay mode."""
    return hashlib.sha256(
        json.dumps({"messages": payload["messages"], "tools": payload.get("tools")}, sort_keys=True).encode()
    ).hexdigest()


# ------------------------------------------------------------------------------------ the verdict

GROWTH_FLAGS = (4.0, 2.0, 1.4)
#: TTFT growth beyond this multiple of the context growth is super-linear, not near-linear.
SUPER_LINEAR = 1.25


def growth_verdict(ttft_by_turn: dict[int, float], tokens_by_turn: dict[int, float]) -> dict[str, Any]:
    """The seed's words for TTFT growth against context growth, from per-turn means.

    Turn 1 is cold and excluded; turn 2 is the warm baseline. g = ttft(last)/ttft(2), c = tokens(last)/
    tokens(2): stable (g ≤ 1.5), sub-linear (g ≤ 0.5·c), near-linear (0.8·c ≤ g ≤ 1.25·c), super-linear
    (g > 1.25·c: TTFT outgrows the context, e.g. 146× against 17× for int8 on an H200), growing otherwise.
    Per-turn flags mark TTFT above 1.4×, 2× and 4× the warm baseline.
    """
    turns = sorted(t for t in ttft_by_turn if t in tokens_by_turn)
    if 2 not in turns or len(turns) < 3:
        return {"verdict": "too few turns", "turns": turns}
    last = turns[-1]
    base_ttft, base_tokens = ttft_by_turn[2], tokens_by_turn[2]
    g = ttft_by_turn[last] / base_ttft
    c = tokens_by_turn[last] / base_tokens
    if g <= 1.5:
        verdict = "stable"
    elif g <= 0.5 * c:
        verdict = "sub-linear"
    elif g > SUPER_LINEAR * c:
        verdict = "super-linear"
    elif g >= 0.8 * c:
        verdict = "near-linear"
    else:
        verdict = "growing"
    flags = {}
    for turn in turns[2:]:
        ratio = ttft_by_turn[turn] / base_ttft
        for limit in GROWTH_FLAGS:
            if ratio > limit:
                flags[turn] = f"TTFT {ratio:.1f}× warm baseline (> {limit:g}×)"
                break
    return {
        "verdict": verdict,
        "ttft_growth": g,
        "context_growth": c,
        "baseline_turn": 2,
        "last_turn": last,
        "flags": flags,
    }
