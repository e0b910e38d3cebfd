"""The stand-in engine process (`pytest_kvcache.testing.standin`) on its own, without the plugin: its
command line, vLLM-shaped startup lines, the OpenAI endpoints, a clean stop on SIGTERM. The plugin-tier
tests (tests/plugin) drive it through pytest."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from pytest_kvcache.testing import standin


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_engine_cmd_runs_this_module() -> None:
    assert standin.MODULE == "pytest_kvcache.testing.standin" == standin.__name__
    assert standin.engine_cmd() == f"{sys.executable} -m pytest_kvcache.testing.standin"
    assert standin.engine_cmd("/opt/py/bin/python") == "/opt/py/bin/python -m pytest_kvcache.testing.standin"


def test_standin_serves_and_stops_on_sigterm() -> None:
    port = free_port()
    argv = [*standin.engine_cmd().split(), "--model", "tiny", "--port", str(port), "--kv-cache-dtype", "fp8"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as response:
                    assert response.status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "the stand-in did not serve within 20 s"
                time.sleep(0.05)
        with urllib.request.urlopen(url + "/v1/models", timeout=5) as response:
            assert json.load(response)["data"][0]["id"] == "tiny"
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            assert 'cache_dtype="fp8"' in response.read().decode()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "Initializing a V1 LLM engine (v0.0.0-standin) with config: model='tiny', kv_cache_dtype=fp8" in out
    assert "Shutting down" in out
