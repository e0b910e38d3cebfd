"""What an engine kind is, and the registry of kinds (``--kv-engine``).

A kind is one module under ``engines/kinds/`` (or one of your own): a :class:`Kind` subclass registered with
:func:`register_kind`, carrying everything the plugin knows about that kind of server — its capability
:class:`EngineProfile`, its KV dtype names and how they become arguments, its command, its log parser, its
Prometheus counter names, its prompt-token counter and its title. Kinds of other packages register through the
``pytest_kvcache.engine_kinds`` entry point group (loaded at plugin start). No pytest here.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import httpx

from pytest_kvcache import kind_registry
from pytest_kvcache.config.arms import Arm, _named_arm, _typed_arm
from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.engines.base import EngineError
from pytest_kvcache.engines.kinds import folder
from pytest_kvcache.engines.scoring import PromptScorer
from pytest_kvcache.model.evidence import LogFacts

if TYPE_CHECKING:
    from pytest_kvcache.config.budget import Need
    from pytest_kvcache.config.embedded import EmbeddedModel
    from pytest_kvcache.config.kv_layout import KvPlan
    from pytest_kvcache.config.plan import Boot

#: The entry point group other packages register their kinds in (each entry: a module or a Kind subclass).
ENTRY_POINT_GROUP = "pytest_kvcache.engine_kinds"
#: The kind every arm is unless ``--kv-engine`` says otherwise.
DEFAULT_KIND = "vllm"

#: Request fields only vLLM takes (top level of a chat/completions body).
VLLM_ONLY_FIELDS = frozenset({"ignore_eos", "min_tokens", "return_tokens_as_token_ids", "prompt_logprobs"})
#: ``stream_options`` keys only vLLM takes.
VLLM_ONLY_STREAM_OPTIONS = frozenset({"continuous_usage_stats"})

#: the built-in kinds' counters; a registered kind names its own (its ``token_counter``), ``local`` none
TokenCounter = str


@dataclass(frozen=True)
class EngineProfile:
    """What the plugin may ask of one kind of server."""

    kind: str
    title: str
    #: top-level request fields this server does not take (removed before sending)
    dropped_fields: frozenset[str] = frozenset()
    dropped_stream_options: frozenset[str] = frozenset()
    #: how prompt tokens are counted for exact-depth prefill: the server's ``/tokenize`` (vLLM's shape),
    #: llama.cpp's ``/apply-template`` + ``/tokenize``, or the model's tokenizer here (``local``)
    tokens: TokenCounter = "local"
    #: what a fresh-prefill request adds so the server computes it from scratch (and can prove it)
    cold_fields: Mapping[str, Any] = field(default_factory=dict)
    #: fields added to every request (llama.cpp: ``timings_per_token``, its per-chunk token count)
    added_fields: Mapping[str, Any] = field(default_factory=dict)
    #: the evidence endpoints this server has (the others are not asked, and the report says so)
    evidence_paths: tuple[str, ...] = ("/v1/models",)
    #: a per-chunk running token count (vLLM's ``continuous_usage_stats``, llama.cpp's ``timings.predicted_n``):
    #: the token clock
    usage_clock: bool = False
    #: greedy decoding reaches exactly ``max_tokens`` (``ignore_eos``); without it a decode may stop early
    exact_length: bool = False
    #: generated token ids with their logprobs (vLLM's ``return_tokens_as_token_ids``, llama.cpp's ``id``):
    #: output agreement
    token_ids: bool = False
    #: llama-server returns no logprobs at all for ``top_logprobs: 0``: asked for at least this many
    min_top_logprobs: int = 0
    #: ``prompt_logprobs`` over token ids on ``/v1/completions``: the fidelity probe
    prompt_logprobs: bool = False
    #: response headers as soon as a request is taken, queued or not (vLLM returns its StreamingResponse before
    #: generating): a request without them after the stall timeout fails as a hung server (``no_response``).
    #: llama-server sends them only once a slot takes the request: one queued behind busy slots has none
    headers_at_once: bool = False
    #: no prompt logprobs, but a forced one-token continuation on ``/completion`` with ``n_probs``
    #: (llama-server): the fidelity probe scores its windows one position at a time on the prompt cache
    forced_scoring: bool = False
    #: its /metrics or log states the KV cache it made (dtype, capacity); a generic server's does not
    states_kv_cache: bool = True

    def adapt(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """``payload`` without the fields this server does not take."""
        out = {k: v for k, v in payload.items() if k not in self.dropped_fields}
        if out.get("stream") is True:
            out.update({k: v for k, v in self.added_fields.items() if k not in out})
        options = out.get("stream_options")
        if isinstance(options, Mapping) and self.dropped_stream_options:
            out["stream_options"] = {k: v for k, v in options.items() if k not in self.dropped_stream_options}
        if out.get("logprobs") is True and int(out.get("top_logprobs") or 0) < self.min_top_logprobs:
            out["top_logprobs"] = self.min_top_logprobs
        return out

    def missing_evidence(self) -> list[str]:
        """What this kind of server cannot show, in words (for the evidence and the report)."""
        missing = []
        if "/metrics" not in self.evidence_paths:
            missing.append("/metrics (prefix-cache hits, engine counters)")
        if not self.states_kv_cache:
            missing.append("resolved KV-cache dtype (no endpoint or log states it)")
            missing.append("KV-cache capacity")
        if self.tokens == "local":
            missing.append("a tokenizer endpoint (prompt tokens counted with the local tokenizer)")
        if not self.exact_length:
            missing.append("exact decode length (no ignore_eos: a greedy decode may stop early)")
        if not self.usage_clock:
            missing.append("per-chunk token counts (the first content chunk is the token clock)")
        if not self.token_ids:
            missing.append("generated token ids (no output agreement)")
        if not self.prompt_logprobs and not self.forced_scoring:
            missing.append("prompt logprobs (no fidelity probe)")
        return missing


Body = Mapping[str, Any]
#: Counts one chat body's prompt tokens (``{"messages": …, "tools": …}``) on the server.
TokenCount = Callable[[Body], int]
#: How a kind's command line is made: (command, arguments without host and port, env overrides).
Command = tuple[tuple[str, ...], list[str], dict[str, str]]


def get_endpoint(client: httpx.Client, path: str) -> tuple[Any, str | None]:
    """GET ``path`` from the server: (its JSON, or the text of ``/metrics``; None) or (None, why not). Never raises."""
    try:
        response = client.get(path)
        if response.status_code != 200:
            return None, f"HTTP {response.status_code}"
        return (response.text if path == "/metrics" else response.json()), None
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def has_flag(args: tuple[str, ...], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def chat_fields(body: Body) -> dict[str, Any]:
    """What decides a chat prompt's tokens: the messages and, where given, the tools."""
    fields: dict[str, Any] = {"messages": list(body["messages"])}
    if body.get("tools"):
        fields["tools"] = body["tools"]
    return fields


@dataclass(frozen=True)
class Container:
    """A kind's engine as the docker launcher starts it: its arguments (after the image's entrypoint), its
    environment, the host folder mounted as its model (host, container path) and its compile cache (the same)."""

    args: list[str]
    env: dict[str, str]
    model_mount: tuple[str, str] | None = None
    compile_cache: tuple[Path, str] | None = None


class Kind(ABC):
    """One kind of server an arm can be. Subclass it in a module, set what differs, write its command line and
    its log parser (the two methods every kind must have), and register it::

        @register_kind("mine")
        class Mine(Kind):
            profile = EngineProfile(kind="mine", title="my server", dropped_fields=VLLM_ONLY_FIELDS)

            def command(self, settings, boot, log_path): ...
            def parse_log(self, text): ...

    The other defaults are a server that serves the embedded model as a folder (``engines/kinds/folder.py``),
    whose arms are its named arms only (set ``dtype_aliases`` and ``dtypes`` for the KV dtype names it takes).
    """

    #: the ``--kv-engine`` value (set by :func:`register_kind`)
    name: str = ""
    profile: EngineProfile = EngineProfile(kind="", title="")
    #: what the terminal's evidence line calls it; None: a vLLM-shaped line (its /metrics cache config)
    short_title: str | None = None
    #: short names users type (``int8``) → the engine's own KV dtype value, and the values it takes itself (none
    #: by default: such a kind's arms are its named arms); a named arm's ``kv_cache_dtype`` is checked against them
    dtype_aliases: Mapping[str, str] = {}
    dtypes: tuple[str, ...] = ()
    #: the dtypes vLLM's CPU build serves, when it serves the embedded model (``cpu_build``): the others are refused
    cpu_dtypes: frozenset[str] = frozenset()
    #: KV dtypes it serves wrongly on float32 weights: a run with such an arm serves the embedded model in bfloat16
    half_kv_on_float32: frozenset[str] = frozenset()
    #: ``--kv-model`` is a file (a GGUF) rather than a model folder; the usage error's words when it is not
    model_is_file: bool = False
    model_file_what: str = "this engine serves a model file"
    #: vLLM's CPU build serves the embedded model by default: arms it cannot serve there are refused up front
    cpu_build: bool = False
    #: the launchers it runs with
    launchers: tuple[str, ...] = ("process", "external")
    #: the process launcher has no default command for it: ``--kv-engine-cmd`` is required
    needs_cmd: bool = True
    #: the flag ``--kv-cache-bytes`` is passed as, which sizes its KV cache in bytes (None: it has no byte budget);
    #: an arm's own such flag is its budget
    budget_flag: str | None = None
    #: environment variables that override that flag: dropped from what the engine inherits when a budget is set
    budget_env: tuple[str, ...] = ()
    #: the flags that set its context length (read by the context check)
    context_flags: tuple[str, ...] = ("--max-model-len",)
    #: it serves the embedded model at the run's ``embedded_dtype`` (vLLM's ``--dtype``; the boot plan says so)
    embedded_dtype: bool = False
    #: Prometheus counters read around each request: name in records → sample name (empty: not scraped)
    counters: Mapping[str, str] = {}
    #: the counter that moves once a request is finished (the "after" scrape waits for it)
    request_success: str | None = None
    #: accepted draft tokens per position (a ``position`` label), when it speculates
    spec_per_position: str | None = None
    #: an info gauge whose labels are its cache config (``cache_dtype``, ``kv_cache_size_tokens`` …); None:
    #: its /metrics is listed by family names only
    cache_config_info: str | None = None
    #: the endpoint(s) its token counter asks, in words (for a sizing error)
    token_endpoint: str = "/tokenize"
    #: how its server scores a prompt teacher-forced, for the fidelity probe (``engines.scoring``: vLLM's prompt
    #: logprobs, llama-server's forced continuations); None: it cannot, and the probe skips on it
    score_prompt: PromptScorer | None = None

    @property
    def title(self) -> str:
        return self.profile.title

    # ------------------------------------------------------------------ settings

    def resolve_arm(self, name: str, named: Mapping[str, Mapping[str, Any]]) -> Arm:
        """One typed arm name: a named arm (``[tool.pytest_kvcache.arms.NAME]``), an alias or a raw dtype."""
        if name in named:
            return _named_arm(name, named[name], self.dtype_aliases, self.dtypes)
        return _typed_arm(name, named, self.dtype_aliases, self.dtypes, "arm")

    def check(self, *, launcher: str, engine_cmd: object) -> None:
        """Refuse a launcher this kind cannot run with (a usage error)."""
        if launcher not in self.launchers:
            raise SettingsError(f"--kv-engine={self.name} runs with the process or external launcher, not {launcher}")
        if self.needs_cmd and launcher == "process" and not engine_cmd:
            raise SettingsError(
                f"--kv-engine={self.name} with the process launcher needs --kv-engine-cmd (the server to start)"
            )

    def kv_plan(self, settings: Settings, arm: Arm, found: Need, budget: int | None) -> KvPlan | None:
        """What this kind's engine will make of ``arm``'s KV ``budget`` (None: no budget given), computed before it
        boots from the served model's layout (``found``): the KV tokens and concurrency it will report, the bytes
        one request of ``max_model_len`` takes. None: this kind has no such arithmetic (the engine's reported
        figure is the only one; a budget is then judged only for a model of full attention throughout)."""
        return None

    def embedded_context(self, spec: EmbeddedModel) -> int:
        """The context an embedded model is served with by this kind."""
        return spec.context

    # ------------------------------------------------------------------ launch

    def prepare_embedded(self, settings: Settings, on_convert: Callable[[str], None] | None) -> None:
        """Before any boot: find, check (and convert) what its engines will serve of the embedded model."""
        folder.embedded_model_folder(settings, on_convert)

    def embedded_name(self, settings: Settings) -> str:
        """What the run serves when embedded, in words for run.json and the report."""
        return folder.embedded_vllm_name(settings)

    @abstractmethod
    def command(self, settings: Settings, boot: Boot, log_path: Path) -> Command:
        """The process launcher's command line for ``boot``: the program, its arguments and its environment."""

    # ------------------------------------------------------------------ evidence

    def container(self, settings: Settings, boot: Boot) -> Container:
        """The docker launcher's engine (``--kv-launcher=docker``): a kind that lists ``docker`` in its
        ``launchers`` says here how its image is started."""
        raise EngineError(f"--kv-engine={self.name} has no container launcher")

    @abstractmethod
    def parse_log(self, text: str) -> LogFacts:
        """The facts its startup log states about itself (absent facts omitted)."""

    def collect(self, client: httpx.Client, evidence: dict[str, Any], errors: dict[str, str]) -> None:  # noqa: B027
        """Evidence from its own endpoints, beyond ``/version``, ``/v1/models`` and ``/metrics``."""

    def token_counter(self, client: Any, model: str) -> TokenCount | None:
        """Counts a chat body's prompt tokens on the server (``client``: the arm's ``post_json``); None:
        counted with the local tokenizer (the profile's ``tokens == "local"``)."""
        if self.profile.tokens == "local":
            return None

        def tokenize(body: Body) -> int:
            return int(client.post_json("/tokenize", {"model": model, **chat_fields(body)})["count"])

        return tokenize


K = TypeVar("K", bound=type[Kind])


def register_kind(name: str) -> Callable[[K], K]:
    """Class decorator: register a :class:`Kind` subclass as ``--kv-engine=name`` (a later one replaces it)."""

    def register(cls: K) -> K:
        if inspect.isabstract(cls):
            missing = " and ".join(sorted(cls.__abstractmethods__))
            raise TypeError(f"engine kind {name!r} ({cls.__module__}.{cls.__qualname__}) must define {missing}")
        cls.name = name
        kind_registry.add(name, cls())
        return cls

    return register


def unregister_kind(name: str) -> None:
    """Forget a registered kind (a test's own toy kind, after the test)."""
    kind_registry.remove(name)


def kind_names() -> tuple[str, ...]:
    """The registered kinds' names: the built-in ones first (vllm, llamacpp, openai), then the others as
    they were registered."""
    return kind_registry.names()


def get_kind(name: str) -> Kind:
    """The registered kind called ``name``; KeyError when there is none."""
    return cast(Kind, kind_registry.get(name))


def find_kind(name: object) -> Kind | None:
    """The registered kind called ``name`` (from a stored evidence dict), or None."""
    return cast("Kind | None", kind_registry.find(name))


_LOADED: list[str] = []
_SCANNED: list[bool] = []


def load_entry_points() -> list[str]:
    """Import the kinds other installed packages register (``pytest_kvcache.engine_kinds``), once; returns
    their entry points' names. An entry point that fails to load is a one-line error naming it."""
    if _SCANNED:
        return list(_LOADED)
    _SCANNED.append(True)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = entry.load()
        except Exception as exc:  # a broken third-party kind: say which, in one line
            what = f"engine kind entry point {entry.name!r} ({entry.value})"
            raise SettingsError(f"{what} failed to load: {type(exc).__name__}: {exc}") from None
        if isinstance(loaded, type) and issubclass(loaded, Kind) and loaded.name not in kind_registry.names():
            try:
                register_kind(loaded.name or entry.name)(loaded)
            except TypeError as exc:
                raise SettingsError(f"engine kind entry point {entry.name!r} ({entry.value}): {exc}") from None
        _LOADED.append(entry.name)
    return list(_LOADED)


if TYPE_CHECKING:
    from pytest_kvcache.config.kinds import KindFacts

    def _facts(kind: Kind) -> KindFacts:
        """mypy checks that every kind is what the settings read of it."""
        return kind
