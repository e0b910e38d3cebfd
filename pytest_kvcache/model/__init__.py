"""The typed run model: what a run writes (records, evidence, boot plan, ``run.json``) and what the report
is made of (summary, deltas, crossovers, gates …). Plain Python, no pytest, no pandas.

These are ``TypedDict``s because every one of them is JSON on disk first: a stored run folder is read back
into exactly these shapes (``pytest_kvcache.report.load``), and ``report.json`` is a :class:`Report`
written out. Readers index them by key as before, but every key and value type is checked by mypy.

Versions: :data:`RECORD_SCHEMA_VERSION` is written into every record and ``run.json``;
:data:`REPORT_VERSION` into ``report.json``. A change that renames or removes a key bumps them.
"""

from __future__ import annotations

from pytest_kvcache.model.base import RECORD_SCHEMA_VERSION as RECORD_SCHEMA_VERSION
from pytest_kvcache.model.base import REPORT_VERSION as REPORT_VERSION
from pytest_kvcache.model.base import Json as Json
from pytest_kvcache.model.base import Outcome as Outcome
from pytest_kvcache.model.base import Verdict as Verdict
from pytest_kvcache.model.evidence import ArmData as ArmData
from pytest_kvcache.model.evidence import CacheConfig as CacheConfig
from pytest_kvcache.model.evidence import Evidence as Evidence
from pytest_kvcache.model.evidence import GpuCard as GpuCard
from pytest_kvcache.model.evidence import GpuSnapshot as GpuSnapshot
from pytest_kvcache.model.evidence import KvPlanData as KvPlanData
from pytest_kvcache.model.evidence import LogFacts as LogFacts
from pytest_kvcache.model.evidence import ModelSize as ModelSize
from pytest_kvcache.model.evidence import PlanEntry as PlanEntry
from pytest_kvcache.model.evidence import ProbeSpecData as ProbeSpecData
from pytest_kvcache.model.evidence import RunMeta as RunMeta
from pytest_kvcache.model.evidence import SettingsData as SettingsData
from pytest_kvcache.model.evidence import kv_capacity_tokens as kv_capacity_tokens
from pytest_kvcache.model.evidence import kv_max_concurrency as kv_max_concurrency
from pytest_kvcache.model.evidence import resolved_cache_dtype as resolved_cache_dtype
from pytest_kvcache.model.evidence import speculative as speculative
from pytest_kvcache.model.records import AgreementRecord as AgreementRecord
from pytest_kvcache.model.records import FidelityRecord as FidelityRecord
from pytest_kvcache.model.records import FidelityWindowData as FidelityWindowData
from pytest_kvcache.model.records import Record as Record
from pytest_kvcache.model.records import RetrievalRecord as RetrievalRecord
from pytest_kvcache.model.records import SampleData as SampleData
from pytest_kvcache.model.records import SamplingRecord as SamplingRecord
from pytest_kvcache.model.report import AgenticSection as AgenticSection
from pytest_kvcache.model.report import AgenticTurn as AgenticTurn
from pytest_kvcache.model.report import AgreementRow as AgreementRow
from pytest_kvcache.model.report import AgreementSection as AgreementSection
from pytest_kvcache.model.report import ArmEntry as ArmEntry
from pytest_kvcache.model.report import BandsUsed as BandsUsed
from pytest_kvcache.model.report import BlockEntry as BlockEntry
from pytest_kvcache.model.report import BootEntry as BootEntry
from pytest_kvcache.model.report import BootResult as BootResult
from pytest_kvcache.model.report import CiStatement as CiStatement
from pytest_kvcache.model.report import ClientLoadSection as ClientLoadSection
from pytest_kvcache.model.report import Comparison as Comparison
from pytest_kvcache.model.report import Confound as Confound
from pytest_kvcache.model.report import Confounds as Confounds
from pytest_kvcache.model.report import CostSection as CostSection
from pytest_kvcache.model.report import CrossoverRow as CrossoverRow
from pytest_kvcache.model.report import DeltaRow as DeltaRow
from pytest_kvcache.model.report import EmptyPoint as EmptyPoint
from pytest_kvcache.model.report import EnergyRow as EnergyRow
from pytest_kvcache.model.report import EnergySection as EnergySection
from pytest_kvcache.model.report import FailureRow as FailureRow
from pytest_kvcache.model.report import FailuresSection as FailuresSection
from pytest_kvcache.model.report import FlagSummary as FlagSummary
from pytest_kvcache.model.report import GateEvidence as GateEvidence
from pytest_kvcache.model.report import GateResult as GateResult
from pytest_kvcache.model.report import GpuCardSummary as GpuCardSummary
from pytest_kvcache.model.report import GpuSummary as GpuSummary
from pytest_kvcache.model.report import GrowthVerdict as GrowthVerdict
from pytest_kvcache.model.report import KvPlanRow as KvPlanRow
from pytest_kvcache.model.report import NoiseBand as NoiseBand
from pytest_kvcache.model.report import NoiseSection as NoiseSection
from pytest_kvcache.model.report import Report as Report
from pytest_kvcache.model.report import ResolvedArm as ResolvedArm
from pytest_kvcache.model.report import SaturatedTrial as SaturatedTrial
from pytest_kvcache.model.report import SavedRow as SavedRow
from pytest_kvcache.model.report import SavedSection as SavedSection
from pytest_kvcache.model.report import SelfCheckSection as SelfCheckSection
from pytest_kvcache.model.report import SpreadInfo as SpreadInfo
from pytest_kvcache.model.report import SummaryRow as SummaryRow
from pytest_kvcache.model.report import _GateExtras as _GateExtras
from pytest_kvcache.model.sections import BaselineCheck as BaselineCheck
from pytest_kvcache.model.sections import CapacityRow as CapacityRow
from pytest_kvcache.model.sections import CapacitySection as CapacitySection
from pytest_kvcache.model.sections import CapacityTrialRow as CapacityTrialRow
from pytest_kvcache.model.sections import FidelityRow as FidelityRow
from pytest_kvcache.model.sections import FidelitySection as FidelitySection
from pytest_kvcache.model.sections import SpecDecodeRow as SpecDecodeRow
from pytest_kvcache.model.sections import SpecDecodeSection as SpecDecodeSection
