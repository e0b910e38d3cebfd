"""Engine kinds (``--kv-engine``): one registered module each — ``vllm``, ``llamacpp``, ``openai`` — and the
registry. A new kind is one module with a :class:`Kind` subclass under ``@register_kind("name")``, imported
before the plugin resolves its options (a ``conftest.py``, a ``-p`` plugin, or an entry point in the
``pytest_kvcache.engine_kinds`` group)."""

from __future__ import annotations

from pytest_kvcache.engines.kinds import llamacpp as llamacpp
from pytest_kvcache.engines.kinds import openai as openai
from pytest_kvcache.engines.kinds import vllm as vllm
from pytest_kvcache.engines.kinds.base import DEFAULT_KIND as DEFAULT_KIND
from pytest_kvcache.engines.kinds.base import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from pytest_kvcache.engines.kinds.base import VLLM_ONLY_FIELDS as VLLM_ONLY_FIELDS
from pytest_kvcache.engines.kinds.base import VLLM_ONLY_STREAM_OPTIONS as VLLM_ONLY_STREAM_OPTIONS
from pytest_kvcache.engines.kinds.base import Command as Command
from pytest_kvcache.engines.kinds.base import EngineProfile as EngineProfile
from pytest_kvcache.engines.kinds.base import Kind as Kind
from pytest_kvcache.engines.kinds.base import find_kind as find_kind
from pytest_kvcache.engines.kinds.base import get_kind as get_kind
from pytest_kvcache.engines.kinds.base import kind_names as kind_names
from pytest_kvcache.engines.kinds.base import load_entry_points as load_entry_points
from pytest_kvcache.engines.kinds.base import register_kind as register_kind
from pytest_kvcache.engines.kinds.base import unregister_kind as unregister_kind
