"""Data the options are checked against: probe defaults and the option value types. An engine's KV dtypes and
aliases are its kind's (``engines/kinds/vllm.py``, ``llamacpp.py``)."""

from __future__ import annotations

import re
from typing import Literal

#: The capacity probe's default SLOs (``probes.capacity``; docs/probes/capacity.md says where they come from):
#: on the embedded CPU default (the tiny model answers a cached 2K-token turn in ~30–130 ms on 2 busy cores and
#: prefills it from scratch in ~150–300 ms), and elsewhere (an interactive agent's bound on a GPU).
CPU_SLO = "ttft_p95<=200ms,itl_p95<=100ms"
GPU_SLO = "ttft_p95<=2s,itl_p95<=60ms"

LauncherKind = Literal["process", "docker", "external"]
Sampling = Literal["greedy", "sampled"]
AgenticMode = Literal["replay", "live"]
Order = Literal["sequential", "abba", "random"]
SelfCheck = Literal["quick", "full", "off"]
Progress = Literal["auto", "lines", "off"]
HostCpuAction = Literal["flag", "exclude", "off"]

#: The seed's depth probes (GPU): fresh prefill at 10K and 90K tokens, 2 agentic sessions of all 15 turns.
SEED_DEPTHS = (10_000, 90_000)
#: The fidelity probe's depths (GPU). An embedded model's CPU sizes, depths included, are its own
#: (``config/embedded.py``).
FIDELITY_DEPTHS = (1_000, 8_000, 32_000)
#: The fidelity probe's committed texts (``probes.fidelity.TEXTS``): all four by default, on a GPU and on the CPU
#: default alike — its CIs replicate over texts, and fewer than 3 give none.
FIDELITY_TEXTS = ("prose", "code", "data", "markup")
#: Probes whose gates are decided over texts or needles, the same on every boot (greedy, teacher-forced): another
#: boot adds nothing, so a run whose gates are all on them adds no adaptive rounds (``report.rounds`` agrees).
BOOT_INVARIANT_PROBES = ("fidelity", "retrieval")
#: The retrieval probe's defaults (docs/probes/retrieval.md): depths (a GPU's; the model's own limit is added where
#: the context is known), needle positions as shares of the context, needles per cell, the baseline ceiling. 90
#: needles a cell decide a 10-point loss at the default: 9 discordant needles against none give an exact p of
#: 2^-8 = 0.0039, under Holm's first step over 9 cells (0.05 / 9 = 0.0056). On the embedded CPU default: 1k and
#: 4k, 4 needles a cell (minutes an arm; the plan says the intervals are wide).
RETRIEVAL_DEPTHS = (8_000, 32_000)
CPU_RETRIEVAL_DEPTHS = (1_000, 4_000)
RETRIEVAL_POSITIONS = (0.1, 0.5, 0.9)
RETRIEVAL_NEEDLES = 90
CPU_RETRIEVAL_NEEDLES = 4
RETRIEVAL_CEILING = 0.8
#: The capacity probe's defaults (docs/probes/capacity.md): depths, mean think time, measured window per
#: trial, tokens per turn, most sessions tried — on a GPU, and on the embedded CPU default (2 cores).
CAPACITY_DEPTHS = (16_000, 32_000)
CPU_CAPACITY_DEPTHS = (2_000, 4_000)
CAPACITY_THINK_S, CPU_CAPACITY_THINK_S = 2.0, 1.0
CAPACITY_WINDOW_S, CPU_CAPACITY_WINDOW_S = 30.0, 5.0
CAPACITY_MAX_TOKENS, CPU_CAPACITY_MAX_TOKENS = 64, 16
CAPACITY_MAX_SESSIONS, CPU_CAPACITY_MAX_SESSIONS = 256, 32

ARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*$")


class SettingsError(ValueError):
    """A bad option value or arm: the plugin turns it into a usage error (exit 4)."""
