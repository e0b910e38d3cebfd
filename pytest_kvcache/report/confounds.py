"""Confound refusal: an A/B is clean only when its boots differ in what the arms declare, and nothing else.

Every boot's evidence is flattened into dotted paths — the engine argv (``argv.--max-num-seqs``), its
environment (``env.VLLM_CPU_KVCACHE_SPACE``), the engine's own non-default args
(``non_default_args.max_num_seqs``), ``vllm:cache_config_info`` (``cache_config.block_size``), engine
version, image digest, model, container settings, GPU models, power caps (``gpu.0.power_limit_w``, the
boot's first card) and driver — and compared
with the baseline's first boot. A difference is *declared* when a knob of one of the two arms explains it
(the arm's ``kv_cache_dtype``, args, env and image, or its ``knobs`` list), *allowed* when a
``--kv-allow-diff`` key covers it, and otherwise a confound. A KV capacity that differs because the dtype
(or a memory knob) differs is expected, not a confound. Boots of one arm must not differ at all.

Plain Python: reads evidence dicts only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

from pytest_kvcache.model.report import Confounds

#: Paths that differ between any two boots by construction (ports, engine index).
PER_BOOT = ("argv.--port", "non_default_args.port", "cache_config.engine", "docker.ports")
#: What a different KV-cache dtype (or memory knob) changes by itself.
CAPACITY = (
    "cache_config.kv_cache_size_tokens",
    "cache_config.num_gpu_blocks",
    "cache_config.num_cpu_blocks",
    "cache_config.kv_cache_max_concurrency",
    "log.kv_cache_size_tokens",
)
#: Names of what an arm's KV dtype sets by itself on other engines (llama-server's ``--cache-type-k/-v`` and
#: the types and size its log states): declared by ``kv_cache_dtype``.
DTYPE_NAMES = frozenset({"cache_type_k", "cache_type_v", "kv_cache_type_k", "kv_cache_type_v", "kv_cache_mib"})
#: Knobs that size the KV cache: declaring one also explains a capacity difference.
MEMORY_KNOBS = frozenset(
    {
        "kv_cache_dtype",
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "max_model_len",
        "block_size",
        "num_gpu_blocks_override",
        "VLLM_CPU_KVCACHE_SPACE",
        "image",
    }
)
#: What a different image (engine version) changes by itself.
IMAGE_PATHS = ("image", "image_digest", "engine_version", "docker.entrypoint")


def knob_name(text: str) -> str:
    """``--max-num-seqs`` / ``--no-enable-prefix-caching`` / ``max_num_seqs`` → ``max_num_seqs`` (env names kept)."""
    name = text.split("=", 1)[0]
    if name.isupper():
        return name
    name = name.lstrip("-").replace("-", "_")
    return name.removeprefix("no_")


def argv_options(argv: Sequence[str]) -> dict[str, Any]:
    """Flags of an engine argv: ``--flag value`` / ``--flag=value`` → value, a bare ``--flag`` → True; the
    words before the first flag (the command) under ``command``."""
    out: dict[str, Any] = {}
    words = list(argv)
    i = 0
    command: list[str] = []
    while i < len(words) and not words[i].startswith("--"):
        command.append(words[i])
        i += 1
    if command:
        out["command"] = " ".join(command)
    while i < len(words):
        word = words[i]
        if word.startswith("--") and "=" in word:
            flag, value = word.split("=", 1)
            out[flag] = value
            i += 1
        elif word.startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--"):
            out[word] = words[i + 1]
            i += 2
        else:
            out[word] = True
            i += 1
    return out


def flatten(evidence: Mapping[str, Any]) -> dict[str, str]:
    """The compared facts of one boot, as dotted path → JSON text of the value."""
    facts: dict[str, Any] = {}
    for key in ("engine_version", "served_model", "model_root", "max_model_len", "image", "image_digest"):
        if evidence.get(key) is not None:
            facts[key] = evidence[key]
    config = evidence.get("config") or {}  # docker
    argv = evidence.get("argv") or config.get("command") or []
    for flag, value in argv_options(argv).items():
        facts[f"argv.{flag}"] = value
    laned = evidence.get("lane") is not None  # pytest-xdist: each lane runs on its own cards by design
    for name, value in (evidence.get("env") or config.get("env") or {}).items():
        if not (laned and name == "CUDA_VISIBLE_DEVICES"):
            facts[f"env.{name}"] = value
    for key in ("entrypoint", "mounts", "device_requests", "ipc_mode", "shm_size"):
        if laned and key == "device_requests":
            continue
        if config.get(key) not in (None, [], {}):
            facts[f"docker.{key}"] = config[key]
    log = evidence.get("log") or {}
    non_default = log.get("non_default_args")
    if isinstance(non_default, Mapping):
        for key, value in non_default.items():
            facts[f"non_default_args.{key}"] = value
    if log.get("kv_cache_size_tokens") is not None:
        facts["log.kv_cache_size_tokens"] = log["kv_cache_size_tokens"]
    for label, value in (evidence.get("cache_config") or {}).items():
        if not str(label).startswith("_"):
            facts[f"cache_config.{label}"] = value
    before = evidence.get("gpu_before") or {}
    if before.get("driver_version") is not None:
        facts["gpu.driver_version"] = before["driver_version"]
    # Cards by their place among the boot's own cards: lanes (and arms pinned to other cards) are compared
    # card for card — the same model and power cap, whatever their indices.
    for position, card in enumerate(before.get("cards") or []):
        for key in ("name", "power_limit_w"):
            if card.get(key) is not None:
                facts[f"gpu.{position}.{key}"] = card[key]
    return {k: json.dumps(v, sort_keys=True, default=str) for k, v in facts.items() if not _per_boot(k)}


def _per_boot(path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in PER_BOOT)


def declared_knobs(arm: Mapping[str, Any]) -> set[str]:
    """What an arm declares it changes (its evidence's ``arm`` dict): ``knobs`` if given, else all it sets."""
    if arm.get("knobs") is not None:
        return {knob_name(k) for k in arm["knobs"]}
    knobs: set[str] = set()
    if arm.get("kv_cache_dtype") is not None:
        knobs.add("kv_cache_dtype")
    args = [a for a in arm.get("args") or [] if a.startswith("--")]
    knobs |= {knob_name(a) for a in args}
    knobs |= set((arm.get("env") or {}).keys())
    if arm.get("image"):
        knobs.add("image")
    return knobs


def _explained(path: str, knobs: set[str], dtype_differs: bool) -> bool:
    last = path.split(".", 1)[1] if "." in path else path
    if path.startswith("env."):
        return last in knobs
    if path.startswith("gpu."):
        return False
    if knob_name(last) in knobs:
        return True
    if path == "cache_config.cache_dtype" and "kv_cache_dtype" in knobs:
        return True
    if knob_name(last) in DTYPE_NAMES and "kv_cache_dtype" in knobs:
        return True
    if path in CAPACITY and (dtype_differs or knobs & MEMORY_KNOBS):
        return True
    return "image" in knobs and path in IMAGE_PATHS


def _allowed(path: str, allow: Iterable[str]) -> str | None:
    for key in allow:
        if path == key or path.startswith(key + "."):
            return key
    return None


def find(boots: Sequence[Mapping[str, Any]], allow: Sequence[str] = ()) -> Confounds:
    """Compare boots' evidence: each arm's first boot with the baseline's first boot (arms may differ in
    what they declare), and every later boot of an arm with that arm's first boot (nothing may differ but
    the KV capacity, which memory profiling can move by a few blocks).

    Returns ``status`` (``clean``, ``CONFOUNDED`` or ``unknown`` when fewer than two boots have evidence),
    ``confounds`` (undeclared, not allowed), ``allowed`` and ``declared`` differences — each with the path,
    both boots and both values — and ``compared`` (how many paths were compared).
    """
    usable = [e for e in boots if e.get("status") in ("ready", "stopped") and e.get("boot")]
    result: dict[str, Any] = {"status": "unknown", "reference": None, "confounds": [], "allowed": [], "declared": []}
    if len(usable) < 2:
        result["reason"] = "fewer than two boots reached ready: nothing to compare"
        return cast(Confounds, result)
    baseline = usable[0]
    result["reference"] = baseline["boot"]
    first_of: dict[str, Mapping[str, Any]] = {}
    compared: set[str] = set()
    for other in usable:
        arm = other.get("arm") or {}
        name = str(arm.get("name"))
        ref = first_of.setdefault(name, other)
        if other is baseline:
            continue
        if ref is other:
            ref = baseline
        ref_arm = ref.get("arm") or {}
        same_arm = ref_arm.get("name") == name
        knobs = set() if same_arm else declared_knobs(ref_arm) | declared_knobs(arm)
        dtypes = {ref_arm.get("kv_cache_dtype") or "auto", arm.get("kv_cache_dtype") or "auto"}
        dtype_differs = not same_arm and len(dtypes) > 1
        ref_facts, facts = flatten(ref), flatten(other)
        compared |= set(ref_facts) | set(facts)
        for path in sorted(set(ref_facts) | set(facts)):
            a, b = ref_facts.get(path), facts.get(path)
            if a == b:
                continue
            entry = {
                "path": path,
                "boot": other["boot"],
                "reference": ref["boot"],
                "reference_value": json.loads(a) if a is not None else None,
                "value": json.loads(b) if b is not None else None,
            }
            if same_arm and path in CAPACITY:
                result["declared"].append({**entry, "why": "KV capacity varies between boots of one arm"})
            elif _explained(path, knobs, dtype_differs):
                result["declared"].append({**entry, "why": "declared by the arms"})
            elif key := _allowed(path, allow):
                result["allowed"].append({**entry, "allowed_by": key})
            else:
                result["confounds"].append(entry)
    result["compared"] = len(compared)
    result["status"] = "CONFOUNDED" if result["confounds"] else "clean"
    return cast(Confounds, result)


def describe(entry: Mapping[str, Any]) -> str:
    """``argv.--max-num-seqs: "8" in f16x vs absent in auto`` — one difference, in words."""

    def show(value: Any) -> str:
        return "absent" if value is None else json.dumps(value, default=str)

    return (
        f"{entry['path']}: {show(entry['value'])} in {entry['boot']} vs "
        f"{show(entry['reference_value'])} in {entry['reference']}"
    )
