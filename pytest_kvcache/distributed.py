"""Scale-out with pytest-xdist: parallel, counterbalanced blocks of boots on lanes (workers and their cards).

``pytest -n 2 --kv-arms=fp8,int8 --kv-replicates=4 --kv-gpu-groups="0,1;2,3"`` starts two workers; each owns
one lane — its GPU group, or over ``--tx ssh=…`` its host and cards — and runs whole blocks (one boot of
every arm, back to back). The placement is ``settings.lane_order``'s Latin square; :class:`BlockScheduling`
(pytest-xdist's ``pytest_xdist_make_scheduler``) sends each lane's blocks to its worker, one block at a time,
and never splits a block. The controller boots nothing: every write of a worker's run reaches the
controller's run folder with the test reports (``run.forward``), and the controller builds the one report.

A worker that dies loses the block it was running (the report names it); a replacement worker (pytest-xdist
restarts crashed workers) takes over the lane's remaining blocks. The controller stops what a dead local
worker left running (its engine registry), and every engine dies with its worker anyway
(``engines.process.die_with_parent``).

The plugin layer: imports pytest and, only when pytest-xdist runs the session, xdist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

from pytest_kvcache.config.constants import SettingsError
from pytest_kvcache.config.plan import BootPlan
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.gpu.nvml import open_nvml
from pytest_kvcache.run.lanes import Lanes, boot_of_nodeid

LANE_KEY = "kvcache_lane"
RUN_ID_KEY = "kvcache_run_id"
EVENTS_KEY = "kvcache_events"


@dataclass(frozen=True)
class Role:
    """This process's part in a pytest-xdist session: ``controller`` (schedules, collects, reports) or
    ``worker`` (boots and measures one lane)."""

    kind: str
    lanes: int
    lane: int = 0
    run_id: str | None = None


def role_of(config: pytest.Config) -> Role | None:
    """The pytest-xdist role of this process, None without pytest-xdist."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if LANE_KEY not in workerinput:
            return None  # a worker of a controller where the plugin was inactive
        return Role(
            "worker", int(workerinput.get("workercount") or 1), int(workerinput[LANE_KEY]), workerinput[RUN_ID_KEY]
        )
    if getattr(config.option, "dist", "no") == "no":  # -n sets it; --tx alone distributes nothing (add -d)
        return None
    from xdist.workermanage import parse_tx_spec_config

    return Role("controller", len(parse_tx_spec_config(config)))


def check(settings: Settings, role: Role) -> None:
    """Usage errors of a distributed run, before anything boots."""
    if settings.launcher == "external":
        raise SettingsError(
            "external endpoints are one server per arm: pytest-xdist (-n/--tx) would measure the same servers "
            "from several workers at once; run without -n"
        )
    if settings.replicates < role.lanes:
        raise SettingsError(
            f"{role.lanes} pytest-xdist workers each run whole blocks (one boot of every arm): "
            f"--kv-replicates={settings.replicates} leaves a worker idle; use --kv-replicates={role.lanes} or more"
        )
    if settings.gpu_groups and len(settings.gpu_groups) != role.lanes:
        raise SettingsError(
            f"--kv-gpu-groups names {len(settings.gpu_groups)} group(s) for {role.lanes} pytest-xdist worker(s): "
            "give one group per worker"
        )
    if settings.gpu_groups:
        pinned = [a.name for a in settings.arms if any(k == "CUDA_VISIBLE_DEVICES" for k, _ in a.env)]
        if pinned:
            raise SettingsError(
                f"arm(s) {', '.join(pinned)} set CUDA_VISIBLE_DEVICES, and --kv-gpu-groups gives each worker its "
                "cards: set one or the other"
            )
        if settings.launcher == "docker" and settings.gpus:
            raise SettingsError("--kv-gpus and --kv-gpu-groups both choose the containers' cards: give one")


def check_shared_cards(settings: Settings, role: Role, count: int | None) -> None:
    """Local workers without ``--kv-gpu-groups`` would boot their engines on the same cards at the same
    time. vLLM sizes its KV cache from the memory it finds free while it starts, so two engines starting
    side by side on one card starve each other (on an H200 one of them found 0.06 GiB for its KV cache and
    exited: docs/results/h200-scale-out-one-card). ``count``: the GPUs NVML sees here (None: no NVML)."""
    engines_see_cards = settings.launcher == "process" or (settings.launcher == "docker" and bool(settings.gpus))
    if role.lanes > 1 and count and not settings.gpu_groups and engines_see_cards:
        raise SettingsError(
            f"{role.lanes} pytest-xdist workers on this host would boot engines side by side on the same "
            f"{count} GPU(s): vLLM sizes its KV cache from the memory free while it starts, so they starve each "
            f"other; give each worker its own cards with --kv-gpu-groups (e.g. "
            f"{';'.join(str(i) for i in range(min(count, role.lanes)))}), or run without -n"
        )


def check_lane_cards(settings: Settings, lane: int, count: int | None, host: str) -> None:
    """A worker's host must have its lane's cards (``count``: the cards NVML sees, None without NVML)."""
    cards = settings.lane_cards(lane)
    if cards is None:
        return
    if count is None:
        raise SettingsError(f"--kv-gpu-groups gives lane {lane} cards {cards}, but {host} has no NVML to find them")
    indices = [c for c in cards.split(",") if c.isdigit()]
    missing = [c for c in indices if int(c) >= count]
    if missing:
        raise SettingsError(
            f"--kv-gpu-groups gives lane {lane} cards {cards}, but {host} has {count} GPU(s): "
            f"no card {', '.join(missing)}"
        )


# ---------------------------------------------------------------------------------------- scheduling


class KvSession(Protocol):
    """What the scheduler and the hooks here need of the plugin's session (``session.KvSession``)."""

    settings: Settings
    boot_plan: BootPlan
    run: Any
    usage_error: str | None

    #: the controller's record of its lanes (``run.lanes``): what the scheduler and the hooks here report
    lanes: Lanes

    def planned_remote(self, tests_per_boot: Mapping[str, int]) -> None: ...


@dataclass
class Block:
    lane: int
    number: int
    extra: bool
    items: list[int] = field(default_factory=list)  # collection indices, in run order


class BlockScheduling:
    """pytest-xdist scheduler: each lane's blocks go to the worker that owns the lane, one whole block at a
    time, in the Latin-square order of ``settings.lane_order``; tests that belong to no boot go to the
    first worker free. A worker's lane is ``workerinput["kvcache_lane"]`` (``Controller.pytest_configure_node``)."""

    def __init__(self, session: KvSession, *, numnodes: int) -> None:
        self.session = session
        self.numnodes = numnodes
        self.node2collection: dict[Any, list[str]] = {}
        self.node2pending: dict[Any, list[int]] = {}
        self.collection: list[str] | None = None
        self.queues: dict[int, list[Block]] = {}
        self.loose: list[int] = []
        self.sent: dict[Any, list[Block]] = {}  # each worker's blocks with tests not yet complete

    # -------------------------------------------------------------- what DSession asks

    @property
    def nodes(self) -> list[Any]:
        return list(self.node2pending)

    @property
    def collection_is_completed(self) -> bool:
        return len(self.node2collection) >= self.numnodes

    @property
    def tests_finished(self) -> bool:
        if not self.collection_is_completed or self.collection is None:
            return False
        if self.loose or any(self.queues.values()):  # a lane whose worker died waits for its replacement
            return False
        return not any(self.node2pending.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.loose) or any(self.queues.values()) or any(self.node2pending.values())

    def lane_of(self, node: Any) -> int:
        return int(node.workerinput[LANE_KEY])

    def add_node(self, node: Any) -> None:
        assert node not in self.node2pending
        self.node2pending[node] = []
        self.sent[node] = []

    def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
        self.node2collection[node] = list(collection)
        if self.collection is not None:
            if list(collection) != self.collection:
                self.session.lanes.problem(self.lane_of(node), "collected different tests than the first worker")
                node.shutdown()
                return
            self._next(node)  # a replacement worker: the lane's remaining blocks

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        pending = self.node2pending[node]
        pending.remove(item_index)
        self.sent[node] = [b for b in self.sent[node] if any(i in pending for i in b.items)]
        self._next(node)

    def mark_test_pending(self, item: str) -> None:
        assert self.collection is not None
        index = self.collection.index(item)
        self.loose.insert(0, index)
        for node in self.node2pending:
            self._next(node)

    def remove_pending_tests_from_node(self, node: Any, indices: Sequence[int]) -> None:
        raise NotImplementedError("pytest-kvcache's scheduler never steals tests")

    def remove_node(self, node: Any) -> str | None:
        """A worker is gone. If it died, the block it was in is lost (the report names it); a block it had
        been sent but not started goes back to its lane, for a replacement worker."""
        pending = self.node2pending.pop(node)
        blocks = self.sent.pop(node, [])
        if not pending:
            return None
        assert self.collection is not None
        crashed = self.collection[pending[0]]
        lane = self.lane_of(node)
        in_blocks = {i for block in blocks for i in block.items}
        self.loose[:0] = [i for i in pending[1:] if i not in in_blocks]  # tests of no boot: run elsewhere
        for block in reversed(blocks):
            if all(i in pending for i in block.items) and pending[0] not in block.items:
                self.queues.setdefault(lane, []).insert(0, block)  # never started: runs on the next worker
            else:
                left = [self.collection[i] for i in block.items if i in pending]
                self.session.lanes.block_lost(lane, block.number, node.gateway.id, left)
        return crashed

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._next(node)
            return
        collections = list(self.node2collection.values())
        first = collections[0]
        if any(c != first for c in collections[1:]):
            raise pytest.UsageError("pytest-kvcache: pytest-xdist workers collected different tests")
        self.collection = first
        boots = self.session.boot_plan.boots
        blocks: dict[int, Block] = {}
        counts: dict[str, int] = {}
        order = {b.boot_id: b.index for b in boots}
        placed: list[tuple[int, int, int]] = []  # (boot index, position in collection, index)
        for index, nodeid in enumerate(first):
            boot = boot_of_nodeid(nodeid, boots)
            if boot is None:
                self.loose.append(index)
                continue
            counts[boot.boot_id] = counts.get(boot.boot_id, 0) + 1
            placed.append((order[boot.boot_id], index, index))
            blocks.setdefault(boot.block, Block(boot.lane, boot.block, boot.extra))
        by_id = {b.boot_id: b for b in boots}
        for _, _, index in sorted(placed):
            boot = boot_of_nodeid(first[index], boots)
            assert boot is not None
            blocks[by_id[boot.boot_id].block].items.append(index)
        for number in sorted(blocks):
            block = blocks[number]
            self.queues.setdefault(block.lane, []).append(block)
        self.session.planned_remote(counts)
        for node in self.nodes:
            self._next(node)

    # -------------------------------------------------------------- sending

    def _next(self, node: Any) -> None:
        """Keep ``node`` fed: a worker must know its next test (or that none comes) before it runs its last
        one, so while one test or none is left, send the next work — loose tests, then its lane's next
        block — and once nothing is left, shut it down."""
        if self.collection is None:
            return
        while not node.shutting_down and len(self.node2pending[node]) <= 1:
            if self.loose:  # tests of no boot need no engine: the first worker free takes them
                items, self.loose = self.loose, []
                self._send(node, items)
                continue
            block = self._next_block(self.lane_of(node))
            if block is None:
                node.shutdown()
                return
            self.sent[node].append(block)
            self._send(node, block.items)

    def _next_block(self, lane: int) -> Block | None:
        """The lane's next block, skipping adaptive blocks the controller decides are not needed."""
        queue = self.queues.get(lane, [])
        while queue:
            block = queue.pop(0)
            if not (block.extra and self.session.lanes.skip_reason(block.number)):
                return block
        return None

    def _send(self, node: Any, items: list[int]) -> None:
        self.node2pending[node].extend(items)
        node.send_runtest_some(items)


class Controller:
    """The controller's pytest-xdist hooks (registered only when pytest-xdist distributes the session)."""

    def __init__(self, session: KvSession) -> None:
        self.session = session
        self.assigned: dict[str, int] = {}
        self.free_lanes: list[int] = []  # lanes whose worker died: the next new worker takes one over

    @pytest.hookimpl
    def pytest_configure_node(self, node: Any) -> None:
        lane = self.free_lanes.pop(0) if self.free_lanes else len(self.assigned)
        self.assigned[node.gateway.id] = lane
        node.workerinput[LANE_KEY] = lane
        node.workerinput[RUN_ID_KEY] = self.session.run.open().run_id
        self.session.lanes.assigned(lane, node.gateway.id)

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> BlockScheduling:
        from xdist.workermanage import parse_tx_spec_config

        return BlockScheduling(self.session, numnodes=len(parse_tx_spec_config(config)))

    @pytest.hookimpl(tryfirst=True)  # before pytest-xdist prints the worker's traceback
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        lane = self.assigned.get(node.gateway.id)
        if lane is None:
            return
        # popped: pytest-xdist tells of a worker's keyboard-interrupt exit twice (finished, then down)
        events = (getattr(node, "workeroutput", None) or {}).pop(EVENTS_KEY, None) or []
        self.session.lanes.forwarded(lane, events)
        if error is not None and not hasattr(node, "workerinfo"):
            # died before it was ready: a usage error on its host (its cards, its settings) ends the run,
            # or pytest-xdist would start its replacement for ever
            said = [line.strip() for line in str(error).splitlines() if "pytest-kvcache: " in line]
            if said:
                text = said[-1][said[-1].index("pytest-kvcache: ") :]
                self.session.usage_error = f"worker {node.gateway.id}: {text}"
                pytest.exit(self.session.usage_error, returncode=pytest.ExitCode.USAGE_ERROR)
        if error is not None:
            self.free_lanes.append(lane)
            self.session.lanes.worker_died(lane, node.gateway.id, str(error))


class Worker:
    """A worker's pytest-xdist side: every test report carries what the worker's run wrote since the last."""

    def __init__(self, session: KvSession) -> None:
        self.session = session

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        outbox = self.session.run.outbox
        if outbox is not None:
            events = outbox.drain()
            if events:
                setattr(report, EVENTS_KEY, events)
        return report


def nvml_count() -> int | None:
    """The GPUs NVML sees on this host, None without NVML."""
    nvml = open_nvml()
    if nvml is None:
        return None
    try:
        return nvml.device_count()
    finally:
        nvml.shutdown()


def all_local(config: pytest.Config) -> bool:
    """Every pytest-xdist worker runs on this host (``-n N`` or ``--tx popen``): the controller can check cards."""
    from xdist.workermanage import parse_tx_spec_config

    return all(spec.startswith("popen") or "popen" in spec.split("//") for spec in parse_tx_spec_config(config))
