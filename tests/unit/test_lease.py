"""The lease on a --save directory (megatron_ext/checkpoint/lease.py), on the file system
alone: a second run refuses naming the holder; a lease whose holder is gone is taken over,
after the timeout for another host, at once for a gone process of this host or for this
Slurm job's own (a requeue); the run whose lease was taken over learns it."""

from __future__ import annotations

import dataclasses
import json
import os
import socket

import pytest

from megatron_ext.checkpoint.lease import SaveLease, lease_path, read_holder
from megatron_ext.runtime.errors import CheckpointError

GONE_PID = 2**22 + 1  # above Linux's largest pid_max: no process has it


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def forge(save_dir, **fields) -> None:
    """A lease file written by another run."""
    holder = {"host": "node-b", "pid": 4321, "slurm_job_id": "77", "token": "theirs",
              "heartbeat": 1000.0, **fields}
    os.makedirs(os.path.dirname(lease_path(str(save_dir))), exist_ok=True)
    with open(lease_path(str(save_dir)), "w") as f:
        json.dump(holder, f)


@pytest.fixture(autouse=True)
def outside_slurm(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


def test_a_second_run_refuses_naming_the_holder(tmp_path):
    clock = Clock()
    first = SaveLease(str(tmp_path), 300, clock)
    assert first.take() == f"[fixedcode] lease on --save {tmp_path} taken"
    clock.now += 100  # within the timeout, no heartbeat
    with pytest.raises(CheckpointError, match=(
            rf"--save {tmp_path} is in use by another run \(host {socket.gethostname()}, "
            rf"pid {os.getpid()}, last heartbeat 100 s ago; lease .*run.lease\)")):
        SaveLease(str(tmp_path), 300, clock).take()
    first.close()
    assert not os.path.exists(lease_path(str(tmp_path)))
    second = SaveLease(str(tmp_path), 300, clock)
    second.take()  # given back: free
    assert os.listdir(tmp_path / ".locks") == ["run.lease"]  # no temporary file left
    second.close()


def test_another_hosts_lease_is_taken_over_after_the_timeout_only(tmp_path):
    forge(tmp_path, slurm_job_id="77")
    clock = Clock(1000.0 + 300)
    with pytest.raises(CheckpointError, match="host node-b, pid 4321, Slurm job 77, last "
                                              "heartbeat 300 s ago"):
        SaveLease(str(tmp_path), 300, clock).take()
    clock.now += 1
    lease = SaveLease(str(tmp_path), 300, clock)
    assert lease.take().endswith("taken over: no heartbeat for 301 s (> 300 s)")
    assert read_holder(lease_path(str(tmp_path))).pid == os.getpid()


def test_a_gone_process_of_this_host_is_taken_over_at_once(tmp_path):
    forge(tmp_path, host=socket.gethostname(), pid=GONE_PID)  # killed -9 a second ago
    lease = SaveLease(str(tmp_path), 300, Clock(1001.0))
    assert lease.take().endswith(f"taken over: its holder, pid {GONE_PID} on this host, "
                                 f"is gone")


def test_this_slurm_jobs_own_lease_is_reclaimed_and_the_older_run_stops_saving(
        tmp_path, monkeypatch):
    """A requeued job (same SLURM_JOB_ID) reclaims its lease while the run of a lost node
    still renews it; that run then learns the lease is gone."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    clock = Clock()
    lost_node = SaveLease(str(tmp_path), 300, clock)
    lost_node.take()
    lost_node.me = dataclasses.replace(lost_node.me, host="node-b")  # as if elsewhere
    requeued = SaveLease(str(tmp_path), 300, clock)
    assert requeued.take().endswith("taken over: this Slurm job's own lease (job 77, requeued)")
    assert lost_node.confirm().startswith("taken over by another run (host ")
    assert requeued.confirm() is None
    lost_node.close()  # gives back nothing that is not its own
    assert read_holder(lease_path(str(tmp_path))).token == requeued.me.token


def test_another_slurm_jobs_live_lease_is_refused(tmp_path, monkeypatch):
    forge(tmp_path, slurm_job_id="77")
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    with pytest.raises(CheckpointError, match="Slurm job 77"):
        SaveLease(str(tmp_path), 300, Clock(1010.0)).take()


def test_the_heartbeat_keeps_a_lease_alive(tmp_path):
    clock = Clock()
    lease = SaveLease(str(tmp_path), 300, clock)
    lease.take()
    clock.now += 250
    lease.heartbeat()
    clock.now += 250  # 500 s after taking, 250 after the heartbeat
    with pytest.raises(CheckpointError, match="last heartbeat 250 s ago"):
        SaveLease(str(tmp_path), 300, clock).take()
