"""Test doubles for testing your own probes and plugins on top of pytest-kvcache — public, on purpose.

Like pytest's ``pytester`` or GuideLLM's mock server, these helpers stand in for what cannot run, or
cannot be made to misbehave on cue, in a test: a GPU, a vLLM server that dies mid-request, a stream
that stalls. Everything a real engine can do is still measured on real vLLM; these are for the rest.

* `pytest_kvcache.testing.standin` — a stand-in engine *process*, vLLM-shaped (arguments, log lines,
  ``/metrics``, ``/tokenize``, OpenAI streaming), serving the calibrated stream. Pass
  ``--kv-engine-cmd=<standin.engine_cmd()>`` and every arm boots it instead of vLLM, in milliseconds;
  ``--standin-…`` engine arguments make it fail at startup, start slowly, die after N requests,
  report another cache dtype or ignore SIGTERM.
* `pytest_kvcache.testing.fake_nvml` — `FakeNvml` / `FakeCard`, an in-memory NVML. Hand it to any
  function of ``pytest_kvcache.gpu`` (or to ``GpuState.open(..., nvml=...)``) to test GPU snapshots,
  sampling, drift flags and power pinning on a machine without a GPU; values may be callables, so a
  card can heat up or start throttling mid-test.
* `pytest_kvcache.testing.stream_faults` — `Fault` and helpers: make the calibrated stream
  (`pytest_kvcache.selfcheck.stream.StreamServer`, also what the stand-in serves) drop the connection,
  stall, send a malformed line or an in-stream error, answer with an HTTP error, omit usage or
  generate nothing — for every request or for one (a request header).

Import from the submodules; importing this package imports nothing. ``docs/testing.md`` has a worked
example.
"""
