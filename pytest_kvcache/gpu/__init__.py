"""The GPUs through NVML: what they are, what they were doing, and whether a measurement drifted.

One module per concern; import from the submodules (this package re-exports nothing, and importing
it imports nothing):

* ``nvml`` — the ``Nvml`` seam, ``RealNvml`` over ``pynvml``, ``open_nvml()``, errors, NVML decoding;
* ``cards`` — ``CardRef`` and ``visible_cards()`` (``CUDA_VISIBLE_DEVICES`` honoured);
* ``snapshot`` — ``snapshot()`` / ``diff()`` around every boot, ``require_idle()``, ``settle()``;
* ``sampler`` — ``Sampler``, the background reader into ``gpu.jsonl``, and its windows;
* ``drift`` — ``DriftRules`` and ``drift()``: flags and exclusion of a request;
* ``power`` — ``--kv-gpu-power-limit`` pinning (parse, apply, verify, restore);
* ``state`` — ``GpuOptions`` / ``GpuState``: the run's GPU session, which the plugin's session drives.

The fake NVML for tests is ``pytest_kvcache.testing.fake_nvml``. ``docs/gpu.md`` defines every field.
"""
