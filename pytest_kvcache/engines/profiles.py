"""Engine profiles: what each kind of server takes, how its tokens are counted, where its evidence lives.

Each kind's profile now lives in its module under ``engines/kinds/`` (the kind's ``profile``); this module
re-exports them for the import paths that name it. No pytest here.
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_kvcache.engines.kinds import get_kind
from pytest_kvcache.engines.kinds.base import VLLM_ONLY_FIELDS as VLLM_ONLY_FIELDS
from pytest_kvcache.engines.kinds.base import VLLM_ONLY_STREAM_OPTIONS as VLLM_ONLY_STREAM_OPTIONS
from pytest_kvcache.engines.kinds.base import ColdProof as ColdProof
from pytest_kvcache.engines.kinds.base import EngineProfile as EngineProfile
from pytest_kvcache.engines.kinds.base import TokenCounter as TokenCounter
from pytest_kvcache.engines.kinds.llamacpp import LLAMACPP as LLAMACPP
from pytest_kvcache.engines.kinds.openai import OPENAI as OPENAI
from pytest_kvcache.engines.kinds.vllm import VLLM as VLLM

PROFILES: Mapping[str, EngineProfile] = {"vllm": VLLM, "llamacpp": LLAMACPP, "openai": OPENAI}


def profile(kind: str) -> EngineProfile:
    """The profile of the registered kind called ``kind``."""
    return get_kind(kind).profile
