"""Value parsers: each takes the raw value (CLI, env or ini) and returns the typed value or raises SettingsError."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_kvcache import kind_registry
from pytest_kvcache.config import grammars
from pytest_kvcache.config.budget import parse_bytes
from pytest_kvcache.config.constants import ARM_NAME, FIDELITY_TEXTS, Order, SettingsError
from pytest_kvcache.config.model_files import TOKENIZER_CONFIG, check_folder


def parse_gpu_groups(raw: str) -> tuple[str, ...]:
    """``0,1;2,3`` → ``("0,1", "2,3")``: one group of cards (indices or UUIDs) per lane; no card twice."""
    groups = tuple(g.strip().replace(" ", "") for g in str(raw).split(";") if g.strip())
    if not groups:
        raise SettingsError(f"expected GPU groups like 0,1;2,3 (one group per worker), got {raw!r}")
    seen: set[str] = set()
    for group in groups:
        if not re.fullmatch(r"[A-Za-z0-9\-]+(,[A-Za-z0-9\-]+)*", group):
            raise SettingsError(f"GPU group {group!r}: expected comma-separated GPU indices/UUIDs like 0,1")
        cards = group.split(",")
        twice = sorted({c for c in cards if c in seen or cards.count(c) > 1})
        if twice:
            raise SettingsError(f"GPU group {group!r}: card(s) {', '.join(twice)} in more than one group")
        seen.update(cards)
    return groups


def positive(raw: Any) -> float:
    """A positive number of seconds (an option's metavar ``S``, unless it says otherwise)."""
    try:
        value = float(str(raw))
    except ValueError:
        raise SettingsError(f"expected a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise SettingsError(f"expected a positive number, got {raw!r}")
    return value


positive.metavar = "S"  # type: ignore[attr-defined]


#: The upper bound of every count option (docs/configuration.md, "Bounds", says why each is what it is). A count
#: is read once, when the option is read: a value past its bound is a usage error before anything boots, never a
#: first trial of 100,000 sessions or a plan of a million boots.
#: Requests per probe shape or depth (warmups, runs): 1,000 measured requests is hours of one shape on a GPU.
MAX_WARMUPS = 100
MAX_RUNS = 1_000
#: --kv-max-runs: 4 × the most runs (its default is 4 × runs).
MAX_ADAPTIVE_RUNS = 4 * MAX_RUNS
#: Boots per arm: each boot is minutes of engine start; 20 is a long, careful A/B, 40 the budget --kv-target-ci
#: gives 20 replicates by default (2 ×).
MAX_REPLICATES = 20
MAX_BOOT_BUDGET = 2 * MAX_REPLICATES
#: A token count (tokens a request decodes, positions a fidelity window scores): 2^20, beyond any served model's
#: context (the context check refines it where the context is known).
MAX_TOKENS = 1_048_576
#: Agentic sessions per arm (each up to 15 turns), and turns of a session (the stock fixture has 15).
MAX_SESSIONS = 100
MAX_TURNS = 1_000
#: Concurrent sessions of the capacity search: beyond any one engine's batch (vLLM's --max-num-seqs is 256-1024).
MAX_CAPACITY_SESSIONS = 4096
#: Trials of each level next to the capacity's knee: each is a measured window of every session.
MAX_CAPACITY_TRIALS = 20
#: Simultaneous streams of one concurrency level.
MAX_STREAMS = 1024
#: Needles in one retrieval haystack (``--kv-retrieval-keys``): 16 distinct keys, one asked.
MAX_KEYS = 16
#: Top-k logprobs per scored position (vLLM's --max-logprobs is 20 by default).
MAX_TOP_K = 100
#: A seed: what numpy's generators take (0 to 2^32 - 1).
MAX_SEED = 2**32 - 1
#: Worker processes of the many-stream client.
MAX_CLIENT_PROCS = 256


def count(minimum: int, maximum: int) -> Callable[[Any], int]:
    """A whole number from ``minimum`` to ``maximum``: the one parser of every count option (its bound is
    docs/configuration.md's "Bounds"). The parser carries its bounds (``parse.minimum``, ``parse.maximum``) and its
    option's metavar (``N``)."""

    def parse(raw: Any) -> int:
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise SettingsError(f"expected a whole number, got {raw!r}") from None
        if value < minimum:
            raise SettingsError(f"expected a whole number >= {minimum}, got {raw!r}")
        if value > maximum:
            raise SettingsError(f"expected a whole number from {minimum} to {maximum:,}, got {raw!r}")
        return value

    parse.minimum = minimum  # type: ignore[attr-defined]
    parse.maximum = maximum  # type: ignore[attr-defined]
    parse.metavar = "N"  # type: ignore[attr-defined]
    return parse


def port(raw: Any) -> int:
    try:
        return count(1, 65535)(str(raw))
    except SettingsError:
        raise SettingsError(f"expected a TCP port (1-65535), got {raw!r}") from None


def tokenizer_dir(rootdir: Path) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        path = Path(str(raw)).expanduser()
        path = path if path.is_absolute() else rootdir / path
        if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
            raise SettingsError(f"{raw!r} is not a tokenizer folder (no tokenizer.json or tokenizer_config.json)")

        check_folder(path.resolve(), (TOKENIZER_CONFIG,))
        return str(path.resolve())

    return parse


def choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise SettingsError(f"expected one of {', '.join(choices)}; got {raw!r}")
        return raw

    return parse


def kind_choice(raw: str) -> str:
    """``--kv-engine``: the name of a registered engine kind (``engines/kinds/``, and other packages' entry
    points), checked when it is parsed, so a kind registered after import counts."""
    return choice(*kind_registry.names())(raw)


def args(raw: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise SettingsError(f"cannot split {raw!r} into arguments: {exc}") from None


def names(raw: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in raw.split(","))
    if not raw.strip() or any(not n for n in names):
        raise SettingsError(f"expected a comma-separated list of arm names, got {raw!r}")
    return names


def boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise SettingsError(f"expected true or false, got {raw!r}")


DEPTH = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kK]?)\s*$")


def parse_depths(raw: str) -> tuple[int, ...]:
    """``"10k,90k"`` → (10000, 90000). Raises ValueError naming the bad part."""
    depths = []
    for part in raw.split(","):
        m = DEPTH.match(part)
        if not m:
            raise ValueError(f"expected depths like 2k,8k,90k or 12000; bad part {part.strip()!r}")
        value = float(m.group(1)) * (1000 if m.group(2) else 1)
        if value < 64 or value != int(value):
            raise ValueError(f"a depth must be a whole number of tokens >= 64; got {part.strip()!r}")
        depths.append(int(value))
    if len(set(depths)) != len(depths):
        raise ValueError(f"depths must be distinct; got {raw!r}")
    return tuple(depths)


#: The fewest positions a fidelity window may hold (one block of the probe's CIs).
BLOCK_MIN = 32


def texts(raw: Any) -> tuple[str, ...]:
    names = [p.strip() for p in (raw if isinstance(raw, list | tuple) else str(raw).split(",")) if p.strip()]
    unknown = [n for n in names if n not in FIDELITY_TEXTS]
    if not names or unknown:
        raise SettingsError(f"expected fidelity texts from {', '.join(FIDELITY_TEXTS)}; got {raw!r}")
    if len(set(names)) != len(names):
        raise SettingsError(f"fidelity texts must be distinct; got {raw!r}")
    return tuple(names)


def positions(raw: Any) -> tuple[float, ...]:
    """Needle positions as percentages of the context: ``10,50,90`` (or ``10%,50%``) → (0.1, 0.5, 0.9)."""
    parts = [p.strip().removesuffix("%") for p in (raw if isinstance(raw, list | tuple) else str(raw).split(","))]
    try:
        found = tuple(float(p) / 100 for p in parts if p)
    except ValueError:
        raise SettingsError(f"expected positions as percentages of the context like 10,50,90; got {raw!r}") from None
    if not found or any(not 0 <= p <= 1 for p in found):
        raise SettingsError(f"positions are percentages from 0 to 100, like 10,50,90; got {raw!r}")
    if len(set(found)) != len(found):
        raise SettingsError(f"positions must be distinct; got {raw!r}")
    return found


def share(raw: Any) -> float:
    """A percentage (``80`` or ``80%``) as a share (0.8)."""
    return pct(raw) / 100


def agentic_depth(raw: Any) -> str:
    """``fit``, ``stock``, a token count (``6k``, ``6000``) or a share of the context (``75%``)."""
    text = str(raw).strip().lower()
    if text in ("fit", "stock"):
        return text
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            share = -1.0
        if not 0 < share <= 100:
            raise SettingsError(f"expected fit, stock, a token count like 6k or a share like 75%; got {raw!r}")
        return f"{share:g}%"
    try:
        (tokens,) = parse_depths(text)
    except ValueError:
        raise SettingsError(f"expected fit, stock, a token count like 6k or a share like 75%; got {raw!r}") from None
    return str(tokens)


def depths(raw: Any) -> tuple[int, ...]:
    try:
        return parse_depths(",".join(raw) if isinstance(raw, list | tuple) else str(raw))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def gate_probe(text: str) -> str:
    """The probe a gate text selects (``decode_tps[short@…]: …`` → ``short``), read by the gate grammar itself
    (:func:`gates` has already checked the text)."""
    return grammars.parse_gate(text).probe


def gates(raw: Any, arms: list[str] | None, points: Mapping[str, Sequence[str]] | None = None) -> tuple[str, ...]:
    """Gate texts, each parsed; with ``arms`` (and ``points``: each probe's points in the run, where known) a gate
    that could not be evaluated in this run is a usage error now, before anything boots, never dropped."""
    texts = [raw] if isinstance(raw, str) else list(raw)
    for text in texts:
        try:
            gate = grammars.parse_gate(text, arms)
        except grammars.GateError as exc:
            raise SettingsError(str(exc)) from None
        why = grammars.unusable(gate, arms, points) if arms else None
        if why is not None:
            raise SettingsError(f"gate {gate.text!r} cannot be evaluated: {why}")
    return tuple(texts)


def power_limit(raw: Any) -> str:
    try:
        grammars.parse_power_limit(str(raw))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    return str(raw)


def compile_cache(raw: Any) -> str:
    text = str(raw).strip()
    if not text:
        raise SettingsError("expected auto, off or a directory")
    if text in ("auto", "off"):
        return text
    return str(Path(text).expanduser().resolve())


def gpus(raw: Any) -> str:
    value = str(raw).strip()
    if value != "all" and not re.fullmatch(r"[A-Za-z0-9\-]+(,[A-Za-z0-9\-]+)*", value):
        raise SettingsError(f"expected all or comma-separated GPU indices/UUIDs, got {raw!r}")
    return value


def settle(raw: Any) -> tuple[float, float]:
    temp, sep, power = str(raw).partition(":")
    if not sep:
        raise SettingsError(f"expected TEMP_C:POWER_W like 45:150, got {raw!r}")
    return positive(temp), positive(power)


def baseline_name(raw: Any) -> str:
    name = str(raw).strip()
    if not ARM_NAME.match(name):
        raise SettingsError(f"a baseline name must be letters, digits, '-' or '_'; got {name!r}")
    return name


def order(raw: Any) -> tuple[Order, int | None]:
    """``sequential``, ``abba``, ``random`` or ``random:SEED``."""
    text = str(raw).strip()
    name, sep, seed = text.partition(":")
    if name not in ("sequential", "abba", "random") or (sep and name != "random"):
        raise SettingsError(f"expected sequential, abba, random or random:SEED; got {text!r}")
    if not sep:
        return name, None  # type: ignore[return-value]
    return "random", count(0, MAX_SEED)(seed)


def pct(raw: Any) -> float:
    text = str(raw).strip().removesuffix("%")
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"expected a percentage like 2 or 2.5%, got {raw!r}") from None
    if not 0 < value < 100:
        raise SettingsError(f"expected a percentage between 0 and 100, got {raw!r}")
    return value


def procs(raw: Any) -> int | None:
    text = str(raw).strip().lower()
    if text == "auto":
        return None
    try:
        return count(1, MAX_CLIENT_PROCS)(text)
    except SettingsError:
        raise SettingsError(f"expected 1 to {MAX_CLIENT_PROCS} client processes or 'auto', got {raw!r}") from None


def positive_or_off(raw: Any) -> float | None:
    text = str(raw).strip().lower()
    return None if text == "off" else positive(text)


def pct_or_off(raw: Any) -> float | None:
    text = str(raw).strip().rstrip("%")
    if text.lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"expected a percentage (0-100) or 'off', got {raw!r}") from None
    if not 0 < value <= 100:
        raise SettingsError(f"expected a percentage between 0 and 100, got {raw!r}")
    return value


def key_counts(raw: Any) -> tuple[int, ...]:
    """The retrieval probe's needles per haystack: distinct counts from 1 to 16, in the order given."""
    text = ",".join(map(str, raw)) if isinstance(raw, list | tuple) else str(raw)
    one = count(1, MAX_KEYS)
    found: list[int] = []
    for part in text.split(","):
        try:
            found.append(one(part))
        except SettingsError as exc:
            raise SettingsError(f"needles per haystack like 1,4: {exc}") from None
    if len(set(found)) != len(found):
        raise SettingsError(f"needles per haystack must be distinct; got {text!r}")
    return tuple(found)


def levels(raw: Any) -> tuple[int, ...]:
    text = ",".join(raw) if isinstance(raw, list | tuple) else str(raw)
    levels = []
    stream_count = count(1, MAX_STREAMS)
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise SettingsError(f"expected stream counts like 1,4,16; bad part {part.strip()!r}") from None
        try:
            levels.append(stream_count(value))
        except SettingsError:
            raise SettingsError(f"a stream count must be between 1 and {MAX_STREAMS}; got {value}") from None
    if len(set(levels)) != len(levels):
        raise SettingsError(f"stream counts must be distinct; got {text!r}")
    return tuple(levels)


def size(raw: Any) -> int:

    try:
        return parse_bytes(str(raw))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def slo(raw: Any) -> str:
    try:
        return grammars.parse_slo(str(raw)).text()
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


DOTTED = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")


def dotted(raw: Any) -> tuple[str, ...]:
    texts = [raw] if isinstance(raw, str) else list(raw)
    keys = []
    for text in texts:
        for key in (k.strip() for k in str(text).split(",")):
            if not DOTTED.match(key):
                raise SettingsError(f"expected a dotted evidence path like cache_config.block_size, got {key!r}")
            keys.append(key)
    return tuple(keys)


def endpoints(values: Sequence[str]) -> dict[str, str]:
    """``ARM=URL`` pairs, one URL per arm. A URL ending in ``/v1`` (the OpenAI SDK's base URL) is taken
    as the server's root: the plugin asks ``/v1/models``, ``/metrics``, ``/tokenize`` … below it."""
    endpoints: dict[str, str] = {}
    for value in values:
        for item in (part.strip() for part in value.split(",")):
            name, sep, url = item.partition("=")
            name = name.strip()
            if not sep or not name or not url.strip():
                raise SettingsError(f"expected ARM=URL, got {item!r}")
            url = url.strip().rstrip("/")
            if not re.match(r"^https?://[^/\s]+", url):
                raise SettingsError(f"expected an http(s) URL for arm {name!r}, got {url!r}")
            if url.endswith("/v1"):
                url = url[: -len("/v1")]
            if name in endpoints and endpoints[name] != url:
                raise SettingsError(
                    f"arm {name!r} is given two endpoints ({endpoints[name]} and {url}); give one URL per arm"
                )
            endpoints[name] = url
    return endpoints


def flag(raw: Any) -> bool:
    """A switch: True from the CLI, or a boolean text from env/ini."""
    return raw if isinstance(raw, bool) else boolean(str(raw))


def stripped(raw: Any) -> str:
    return str(raw).strip()


def joined(raw: Any) -> str:
    """A value given once (a string) or repeated (a list) as one comma-separated string."""
    return ",".join(raw) if isinstance(raw, list | tuple) else str(raw)


gpu_groups = parse_gpu_groups


def not_a_folder(path: Path, what: str = "folder") -> str | None:
    """Why ``path`` cannot be a ``what`` (it is a file, or under one), or None: it is a folder, or can be made."""
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a {what}"
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        return f"{path} is under {parent}, which is a file"
    return None


def unwritable_folder(path: Path) -> str | None:
    """Why ``path`` cannot be a folder to write in (``cannot create …`` / ``cannot write in …``), or None.

    Found by doing it, since ``os.access`` says yes to root however the folder is made (sysfs, a read-only
    mount): a file is made and removed in ``path``, or, where it does not exist yet, a uniquely named folder in
    its nearest existing parent (where creating it would begin). Nothing is left behind, and no name another
    process may be creating at the same time (pytest-xdist workers) is touched."""
    import tempfile

    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if existing == path:
            with tempfile.TemporaryFile(dir=path):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(prefix=".kvcache-check-", dir=existing))
    except OSError as exc:
        return f"cannot {'write in' if existing == path else 'create'} {path}: {exc.strerror or exc}"
    return None
