"""pytest-kvcache: LLM-serving A/B benchmarks as pytest tests."""

from pytest_kvcache.client import Client
from pytest_kvcache.config.arms import Arm
from pytest_kvcache.config.plan import Boot
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.sample import Sample

__all__ = ["Arm", "Boot", "Client", "Sample", "Settings"]
__version__ = "0.1.0.dev0"
