"""The external launcher: an already running server the user points at with ``--kv-endpoint``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_kvcache.engines.base import EngineError, wait_ready


class ExternalEngine:
    """Nothing to launch or stop: readiness is one check that the URL answers ``/v1/models``."""

    def __init__(self, boot_id: str, url: str, *, log_path: Path, startup_timeout_s: float) -> None:
        self.boot_id = boot_id
        self._url = url.rstrip("/")
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.ready_s: float | None = None

    @property
    def url(self) -> str:
        return self._url

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(f"# external engine at {self._url}: its log is not visible to pytest-kvcache\n")
        try:
            self.ready_s = wait_ready(
                self._url,
                boot_id=self.boot_id,
                timeout_s=min(self.startup_timeout_s, 30.0),
                exited=lambda: None,
                log_path=self.log_path,
            )
        except EngineError as exc:
            raise EngineError(f"{self.boot_id}: external endpoint unreachable — {exc.headline}") from None

    def stop(self) -> None:
        return None

    def alive(self) -> bool:
        return True

    def describe(self) -> dict[str, Any]:
        return {"launcher": "external", "url": self._url, "ready_s": self.ready_s}
