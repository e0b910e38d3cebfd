"""pytest-xdist scale-out on the stand-in engine: blocks of boots on two workers, one run folder and one
report with the block table, a worker that dies mid-run, Ctrl-C on the controller, usage errors, and
workers reached through a real ssh gateway (an sshd on 127.0.0.1 that this module starts and stops)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_kvcache.run.folder import read_records
from tests.plugin.conftest import kill_leftovers, latest, processes_with, spawn_pytest

pytest.importorskip("xdist")


def _lane_orders(report: dict[str, object]) -> dict[str, list[str]]:
    return report["ci"]["lane_order"]  # type: ignore[index,no-any-return]


def test_two_workers_run_counterbalanced_blocks_into_one_report(
    pytester: pytest.Pytester, standin_args: list[str]
) -> None:
    """``-n 2``, 2 arms × 2 replicates: 4 boots, one block (A B / B A) on each worker at the same time; every
    record reaches the controller's one run folder, and its report has the block table."""
    result = pytester.runpytest_subprocess("-n", "2", "--kv-arms=auto,float16", "--kv-replicates=2", *standin_args)
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(
        [
            "*order on lane 0: auto.r1 → float16.r1",
            "*order on lane 1: float16.r2 → auto.r2",
            "*block 1 on lane 0 (gw0, GPUs all): complete",
            "*block 2 on lane 1 (gw1, GPUs all): complete",
        ]
    )
    folder = latest(pytester)
    records = read_records(folder / "requests.jsonl")
    assert {r["boot"] for r in records if r["phase"] == "measured"} == {
        "auto.r1",
        "float16.r1",
        "float16.r2",
        "auto.r2",
    }
    assert len({r["run_id"] for r in records}) == 1 == len({folder.name, records[0]["run_id"]})
    report = json.loads((folder / "report.json").read_text())
    assert [(b["block"], b["lane"], b["boots"], b["status"]) for b in report["blocks"]] == [
        (1, 0, ["auto.r1", "float16.r1"], "complete"),
        (2, 1, ["float16.r2", "auto.r2"], "complete"),
    ]
    evidence = {b: json.loads((folder / "arms" / b / "evidence.json").read_text()) for b in ("auto.r2", "float16.r1")}
    assert evidence["auto.r2"]["lane"] == 1 and evidence["float16.r1"]["lane"] == 0
    assert (folder / "arms" / "auto.r2" / "engine.log").read_text().strip()  # the worker's engine log came too
    assert {p.name for p in (folder / "lanes").iterdir()} == {"0", "1"}
    assert "## Blocks (pytest-xdist lanes)" in (folder / "report.md").read_text()
    started = {b: evidence_of(folder, b)["started_unix_s"] for b in ("auto.r1", "float16.r2")}
    stopped = {b: evidence_of(folder, b)["stopped_unix_s"] for b in ("auto.r1", "float16.r2")}
    assert started["float16.r2"] < stopped["auto.r1"] and started["auto.r1"] < stopped["float16.r2"]  # in parallel


def evidence_of(folder: Path, boot: str) -> dict[str, object]:
    return json.loads((folder / "arms" / boot / "evidence.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-n", "2"], "*--kv-replicates=1 leaves a worker idle; use --kv-replicates=2 or more*"),
        (["--kv-gpu-groups=0;1"], "*--kv-gpu-groups needs pytest-xdist*"),
        (["-n", "2", "--kv-replicates=2", "--kv-gpu-groups=0;1;2"], "*names 3 group(s) for 2 pytest-xdist worker(s)*"),
        (["-n", "2", "--kv-replicates=2", "--kv-gpu-groups=0;1"], "*lane 0 cards 0, but this host has no NVML*"),
    ],
    ids=["idle-worker", "groups-without-xdist", "groups-count", "host-without-the-cards"],
)
def test_distributed_usage_errors_exit_4_before_anything_boots(
    pytester: pytest.Pytester, standin_args: list[str], args: list[str], said: str
) -> None:
    result = pytester.runpytest_subprocess("--kv-arms=auto,float16", *standin_args, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([said])
    assert not (pytester.path / ".kvcache" / "runs").exists() or not list(
        (pytester.path / ".kvcache" / "runs").iterdir()
    )


DIES = """
import os
import signal

import pytest


@pytest.mark.short
def test_worker_dies_in_auto_r2(kv_server):
    if kv_server.boot.boot_id == "auto.r2":
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_worker_that_dies_loses_only_its_block(pytester: pytest.Pytester, standin_args: list[str], tag: str) -> None:
    """The worker of lane 1 is killed (SIGKILL) in the second boot of its block: lane 0's block and the
    boot lane 1 finished stay in the run, the report is built and names the lost block, no engine stays."""
    pytester.makepyfile(test_dies=DIES)
    result = pytester.runpytest_subprocess("-n", "2", "--kv-arms=auto,float16", "--kv-replicates=2", *standin_args)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("passed") == 9, result.stdout.str()
    result.stdout.fnmatch_lines(["*crashed*test_worker_dies_in_auto_r2[[]auto.r2[]]*"])
    folder = latest(pytester)
    report = json.loads((folder / "report.json").read_text())
    blocks = {b["block"]: b for b in report["blocks"]}
    assert blocks[1]["status"] == "complete"
    assert blocks[2]["status"].startswith("lost: worker gw1 died in block 2")
    measured = {r["boot"] for r in read_records(folder / "requests.jsonl") if r["phase"] == "measured"}
    assert measured == {"auto.r1", "float16.r1", "float16.r2"}
    assert any("worker gw1 died in block 2; boots lost: auto.r2" in n for n in report["notes"])
    assert not processes_with(tag)


def test_ctrl_c_on_the_controller_stops_every_workers_engine(
    pytester: pytest.Pytester, standin_args: list[str], tag: str
) -> None:
    slow = [a for a in standin_args if not a.startswith(("--kv-runs", "--kv-max-tokens", "--kv-engine-args"))]
    proc = spawn_pytest(
        pytester,
        "-n",
        "2",
        "--kv-arms=auto,float16",
        "--kv-replicates=2",
        *slow,
        "--kv-runs=200",
        "--kv-max-tokens=100",
        f"--kv-engine-args={tag} --standin-itl=0.01",
    )
    try:
        deadline = time.monotonic() + 90
        while len(processes_with(tag)) < 2:  # both workers' engines are up
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()  # type: ignore[union-attr]
            time.sleep(0.2)
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)  # the controller only, not its process group
        out, _ = proc.communicate(timeout=90)
        gone = time.monotonic() + 20
        while processes_with(tag) and time.monotonic() < gone:
            time.sleep(0.2)
        assert not processes_with(tag), out.decode()
    finally:
        kill_leftovers(proc, tag)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out.decode()
    folder = latest(pytester)
    assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"


# ---------------------------------------------------------------------------------------- ssh


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An sshd on 127.0.0.1 (key-based, this user) for pytest-xdist's ssh gateway; yields an ssh_config file
    whose host ``kvtest`` reaches it. With CI=true a missing sshd fails the test (``.ci/run`` installs it)."""
    sshd_bin, keygen = shutil.which("sshd") or "/usr/sbin/sshd", shutil.which("ssh-keygen")
    if not (Path(sshd_bin).exists() and keygen and shutil.which("ssh")):
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but OpenSSH (sshd, ssh, ssh-keygen) is missing: .ci/run must install openssh-server")
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server)")
    home = tmp_path_factory.mktemp("sshd")
    for name in ("host", "client"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(home / name)], check=True)
    (home / "authorized_keys").write_text((home / "client.pub").read_text())
    os.chmod(home / "authorized_keys", 0o600)
    port = _free_port()
    (home / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {home / 'host'}\nPidFile {home / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {home / 'authorized_keys'}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
    )
    user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    config = home / "ssh_config"
    config.write_text(
        f"Host kvtest\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {home / 'client'}\n"
        "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        "  BatchMode yes\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
    log = (home / "sshd.log").open("wb")
    proc = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(home / "sshd_config")], stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            probe = subprocess.run(["ssh", "-F", str(config), "kvtest", "true"], capture_output=True, timeout=20)
            if probe.returncode == 0:
                break
            assert proc.poll() is None and time.monotonic() < deadline, (home / "sshd.log").read_text()
            time.sleep(0.3)
        yield config
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def _ssh_workers(pytester: pytest.Pytester, sshd: Path) -> tuple[Path, str]:
    """A folder for two ssh workers to run in (``chdir``), and their ``--tx`` spec through the test's sshd."""
    remote = pytester.path / "remote"
    remote.mkdir()
    (remote / "conftest.py").write_text("")
    return remote, f"2*ssh=kvtest//ssh_config={sshd}//python={sys.executable}//chdir={remote}"


def test_workers_over_an_ssh_gateway_land_their_records_on_the_controller(
    pytester: pytest.Pytester, standin_args: list[str], sshd: Path, tag: str
) -> None:
    """Two workers started through ssh (``--tx 2*ssh=…``), each measuring next to its engine on its host:
    their records, evidence and engine logs travel back over the gateway into the controller's run folder.
    (Both hosts are this machine; the workers write their own folders under a folder of their own, so what
    the controller has came over the channel.)"""
    remote, spec = _ssh_workers(pytester, sshd)
    spec += f"//env:PYTEST_KVCACHE_STORE={pytester.path / 'store'}"
    result = pytester.runpytest_subprocess(
        "-d",
        "--tx",
        spec,
        "--kv-arms=auto,float16",
        "--kv-replicates=2",
        *standin_args,
    )
    result.assert_outcomes(passed=8)
    folder = latest(pytester)
    assert folder.parent == pytester.path / ".kvcache" / "runs"
    measured = [r for r in read_records(folder / "requests.jsonl") if r["phase"] == "measured"]
    assert {r["boot"] for r in measured} == {"auto.r1", "float16.r1", "float16.r2", "auto.r2"}
    workers = list((remote / ".kvcache" / "runs" / "workers").iterdir())
    assert len(workers) == 2 and all(w.name.startswith(folder.name + "-lane") for w in workers)
    report = json.loads((folder / "report.json").read_text())
    assert [b["status"] for b in report["blocks"]] == ["complete", "complete"]
    assert all(json.loads((folder / "lanes" / str(n) / "run.json").read_text())["role"] == "worker" for n in (0, 1))
    assert not processes_with(tag)


def test_a_host_without_its_cards_is_a_usage_error_from_its_ssh_worker(
    pytester: pytest.Pytester, standin_args: list[str], sshd: Path
) -> None:
    """Over ssh only the worker can look at its host's cards: a group its host lacks ends the run with exit 4
    and the worker's headline (no traceback, no endless restarts of the worker)."""
    _, spec = _ssh_workers(pytester, sshd)
    result = pytester.runpytest_subprocess(
        "-d",
        "--tx",
        spec,
        "--kv-arms=auto,float16",
        "--kv-replicates=2",
        "--kv-gpu-groups=0;1",
        *standin_args,
        timeout=120,
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    # either worker may get there first: each names its own lane and cards
    assert re.search(r"worker gw([01]): pytest-kvcache: --kv-gpu-groups gives lane \1 cards \1, but worker host", text)
    assert "has no NVML to find them" in text and "Traceback" not in text
