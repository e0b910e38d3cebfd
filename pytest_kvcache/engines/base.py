"""What every launcher shares: the Engine protocol, the startup error, readiness polling, redaction."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

import httpx

from pytest_kvcache.interrupt import INTERRUPT_GRACE_S

LOG_TAIL_LINES = 40


class EngineError(Exception):
    """An engine could not start, was not the one declared, or died. Carries a headline and a log tail."""

    def __init__(self, headline: str, log_tail: str = "") -> None:
        super().__init__(headline)
        self.headline = headline
        self.log_tail = log_tail

    def render(self) -> str:
        if not self.log_tail.strip():
            return self.headline
        body = "\n".join("    " + line for line in self.log_tail.rstrip().splitlines())
        return f"{self.headline}\n  last lines of the engine log:\n{body}"

    def __str__(self) -> str:
        return self.render()


@runtime_checkable
class Engine(Protocol):
    """One running OpenAI-compatible server for one boot of one arm."""

    boot_id: str
    log_path: Path

    @property
    def url(self) -> str: ...

    def start(self) -> None:
        """Start and wait until ready; on any failure clean up and raise EngineError."""

    def stop(self) -> None:
        """Stop and free everything; idempotent."""

    def alive(self) -> bool:
        """False once the engine is known to have died."""

    def describe(self) -> dict[str, Any]:
        """Launcher-specific evidence (argv, env, pid, image …), secrets redacted."""


HOST = "127.0.0.1"


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def started(engine: Any, launch: Callable[[IO[bytes]], None]) -> None:
    """Boot a launcher's engine: once its port is found free, ``launch`` it with its log opened for appending, then
    wait until it answers (``engine.ready_s``); on any failure stop the engine before raising (Ctrl-C during the
    boot: without waiting out a full grace)."""
    try:
        if port_in_use(engine.port):
            raise EngineError(f"{engine.boot_id}: port {engine.port} on {HOST} is already in use")
        engine.log_path.parent.mkdir(parents=True, exist_ok=True)
        launch(engine.log_path.open("ab"))
        engine.ready_s = wait_ready(
            engine.url,
            boot_id=engine.boot_id,
            timeout_s=engine.startup_timeout_s,
            exited=engine.exit_code,
            log_path=engine.log_path,
        )
    except KeyboardInterrupt:
        engine.term_grace_s = INTERRUPT_GRACE_S
        engine.stop()
        raise
    except BaseException:
        engine.stop()
        raise


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


LOG_PREFIX = re.compile(r"^(?:\([^)]*\)\s+)?(?:[A-Z]+\s+(?:\d\d-\d\d\s+[\d:.]+\s+)?\[[^\]]*\]\s+)?")
SALIENT = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception)|[\w./\-]+: error):\s.+")
#: What the Python interpreter itself says when ``python -m MODULE`` or ``python FILE`` cannot start.
INTERPRETER = re.compile(
    r"^[\w./\-]+: (?:Error while finding module specification for '[^']+' \((?P<cause>[^)]+)\)"
    r"|(?P<open>can't open file .+)|(?P<nomod>No module named .+))$"
)


#: llama-server's own failures: its argument parser (``error: invalid argument: --x``) and error-level log
#: lines (``0.00.027.463 E llama_model_load: error loading model: …``).
LLAMA_ERROR = re.compile(r"^(?:error\b[^:]*: .+|[\d.]+ E\s+(?P<text>\S.*))$")

GENERIC_ERRORS = ("see root cause above", "engine core initialization failed", "please check the stack trace")


def salient_error(log_text: str) -> str | None:
    """The root-cause line of an engine log (``NotImplementedError: …``, ``… error: unrecognized …``).

    The first specific error wins; wrappers that only point elsewhere ("see root cause above") are skipped.
    """
    fallback = None
    for line in log_text.splitlines():
        if found := INTERPRETER.match(line.strip()):
            return found.group("cause") or found.group("open") or found.group("nomod")
        if found := LLAMA_ERROR.match(line.strip()):
            return (found.group("text") or found.group(0)).strip()
        if m := SALIENT.match(LOG_PREFIX.sub("", line.strip())):
            text = m.group(0).strip()
            if any(g in text.lower() for g in GENERIC_ERRORS):
                fallback = fallback or text
                continue
            return text
    return fallback


def wait_ready(
    url: str,
    *,
    boot_id: str,
    timeout_s: float,
    exited: Callable[[], int | None],
    log_path: Path,
    poll_s: float = 0.5,
) -> float:
    """Poll ``GET /v1/models`` until it answers 200. Returns seconds waited.

    Fails fast when ``exited()`` returns an exit code; retries only transient errors (connection
    refused/reset, timeouts, 5xx); raises EngineError with the URL, the elapsed time and the log tail.
    """
    start = time.monotonic()
    last_error = "no answer yet"
    with httpx.Client(timeout=httpx.Timeout(5.0)) as client:
        while True:
            elapsed = time.monotonic() - start
            code = exited()
            if code is not None:
                log_tail = tail(log_path, 400)
                reason = salient_error(log_tail)
                raise EngineError(
                    f"{boot_id}: engine exited with code {code} during startup after {elapsed:.1f} s ({url})"
                    + (f": {reason}" if reason else ""),
                    "\n".join(log_tail.splitlines()[-LOG_TAIL_LINES:]),
                )
            try:
                response = client.get(url.rstrip("/") + "/v1/models")
                if response.status_code == 200:
                    return time.monotonic() - start
                last_error = f"HTTP {response.status_code}"
                if 400 <= response.status_code < 500 and response.status_code not in (404, 408, 429):
                    raise EngineError(
                        f"{boot_id}: {url}/v1/models answered HTTP {response.status_code}; is this an "
                        "OpenAI-compatible server?",
                        tail(log_path),
                    )
            except httpx.TransportError as exc:
                last_error = f"{type(exc).__name__}"
            if elapsed > timeout_s:
                raise EngineError(
                    f"{boot_id}: not ready at {url} after {elapsed:.0f} s (startup timeout {timeout_s:g} s; "
                    f"last: {last_error})",
                    tail(log_path),
                )
            time.sleep(poll_s)


# ------------------------------------------------------------------------------------------ redaction

SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL|AUTH)", re.I)
SECRET_FLAGS = {"--api-key", "--hf-token", "--token", "--password"}
REDACTED = "***"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if SECRET_NAME.search(k) else v) for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


#: Environment variables worth recording as evidence (besides the arm's own).
EVIDENCE_ENV = re.compile(r"^(VLLM_|CUDA_|NCCL_|HF_|PYTORCH_|OMP_|TORCH_|NVIDIA_|TRANSFORMERS_)")


def evidence_env(env: Mapping[str, str]) -> dict[str, str]:
    return redact_env({k: v for k, v in sorted(env.items()) if EVIDENCE_ENV.match(k)})
