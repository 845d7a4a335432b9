"""Cooperative rebalancing (issue 38, KIP-429) on real `faust -A app worker` processes and the
embedded broker: a group that grows, a rolling upgrade from eager, and a SIGKILL.

What was kept, revoked and newly assigned is read from each worker's own record of its
rounds (the view's `rebalance_protocol.rounds`, written by its group coordinator:
assignor/faust_adapter/cooperative.py), never from timing.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pytest

from app.cluster import WorkerProcess, wait_for
from tables.testing import EmbeddedBroker
from tests.scale_out import Background
from tests.workers import PARTITIONS, Cluster, cluster

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]

COOPERATIVE = {"TANDEM_REBALANCE_PROTOCOL": "cooperative"}


def _protocol(worker: WorkerProcess) -> dict[str, Any]:
    view = worker.view()
    assert view is not None, f"{worker.name} does not answer"
    found = view["rebalance_protocol"]
    assert found is not None
    return found


def _rounds_since(worker: WorkerProcess, since: float) -> list[dict[str, Any]]:
    return [r for r in _protocol(worker)["rounds"] if r["at"] >= since]


def _actives(worker: WorkerProcess) -> set[int]:
    view = worker.join()
    return set(view["actives"]) if view is not None else set()


def _settled(workers: list[WorkerProcess], protocol: str = "cooperative") -> bool:
    """Every partition active on one worker, each worker with its share, no round pending."""
    views = [w.join() for w in workers]
    if any(v is None for v in views):
        return False
    owned = sorted(p for v in views for p in v["actives"])  # type: ignore[index]
    share = PARTITIONS // len(workers)
    protocols = [_protocol(w) for w in workers]
    return (
        owned == list(range(PARTITIONS))
        and all(len(v["actives"]) >= share for v in views)  # type: ignore[index]
        and all(p["group_runs"] == protocol and not p["pending"] and not p["revoked"] for p in protocols)
    )


def _input_tps(c: Cluster, partitions: set[int]) -> set[str]:
    s = c.settings
    return {f"{topic}:{p}" for topic in (s.impressions, s.clicks) for p in partitions}


def _results(c: Cluster, expected: set[str]) -> set[str]:
    found = c.joins(expected, timeout=60)
    missing = expected - found
    assert not missing, f"{len(missing)} join results missing, e.g. {sorted(missing)[:3]}"
    assert found <= expected, f"spurious results: {sorted(found - expected)[:3]}"
    return found


def test_a_third_worker_joins_and_the_kept_partitions_are_never_revoked(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    with cluster(broker, unique, tmp_path, worker_env=COOPERATIVE) as c:
        workers = [c.worker(f"w{i}", f"host-{i}").start() for i in (1, 2)]
        c.wait_covered(90)
        assert wait_for(lambda: _settled(workers), 60), f"two workers not settled; logs in {tmp_path}"
        before = {w.name: _actives(w) for w in workers}
        traffic = c.traffic(f"r{unique}")
        background = Background(broker.bootstrap, traffic, rate=100).start()
        time.sleep(2)
        joined_at = time.time()
        newcomer = c.worker("w3", "host-3").start()
        everyone = [*workers, newcomer]
        assert wait_for(lambda: _settled(everyone), 90), f"three workers not settled; logs in {tmp_path}"
        time.sleep(2)
        sent = background.stop()
        _results(c, sent.expected)

        assert len(_actives(newcomer)) == PARTITIONS // 3
        rounds = {w.name: _rounds_since(w, joined_at - 1) for w in everyone}
        for worker in workers:
            assert rounds[worker.name], f"{worker.name} saw no round since w3 came"
            assert all(r["protocol"] == "cooperative" for r in rounds[worker.name]), rounds[worker.name]
            # What it ran before and still runs, it ran all along: kept in every round.
            stayed = _input_tps(c, before[worker.name] & _actives(worker))
            assert stayed, f"{worker.name} kept nothing of {before[worker.name]}"
            for r in rounds[worker.name]:
                assert stayed <= set(r["kept"]) and not stayed & set(r["revoked"]), (worker.name, r)
        _one_owner_at_a_time(c, before, rounds)
        page = newcomer.html("/tandem/group", timeout=10)
        assert "<h2>Rebalance protocol</h2>" in page and "<td>cooperative</td>" in page


def _one_owner_at_a_time(
    c: Cluster, before: dict[str, set[int]], rounds: dict[str, list[dict[str, Any]]]
) -> None:
    """Replays every worker's rounds in time order: a partition is newly assigned to a worker only
    once its previous owner has revoked it (each worker notes a round once its revocations are
    released, and the follow-up that assigns them starts after that)."""
    holder = {tp: name for name, owned in before.items() for tp in _input_tps(c, owned)}
    events = sorted(
        (r["at"], kind, name, tp)
        for name, found in rounds.items()
        for r in found
        for kind in ("revoked", "newly_assigned")
        for tp in r[kind]
        if tp in _input_tps(c, set(range(PARTITIONS)))
    )
    for at, kind, name, tp in events:
        if kind == "revoked":
            assert holder.get(tp) == name, f"{name} revoked {tp} held by {holder.get(tp)} at {at}: {rounds}"
            holder[tp] = ""
        else:
            assert holder.get(tp, "") in ("", name), (
                f"{tp} given to {name} while {holder[tp]} ran it: {rounds}"
            )
            holder[tp] = name


def test_a_rolling_upgrade_from_eager_switches_once_every_member_is_cooperative(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    """KIP-429's upgrade: workers restarted one by one with the setting. While one still runs
    eager the group runs eager rounds (no worker keeps anything through a join); once all have
    the setting, the group runs cooperative rounds, through a second rolling restart and a
    leave; nothing is lost on the way, nothing spurious."""
    with cluster(broker, unique, tmp_path, worker_env={"TANDEM_REBALANCE_PROTOCOL": "eager"}) as c:
        workers = [c.worker(f"w{i}", f"host-{i}").start() for i in (1, 2, 3)]
        c.wait_covered(90)
        assert wait_for(lambda: _settled(workers, "eager"), 60), f"not settled; logs in {tmp_path}"
        traffic = c.traffic(f"r{unique}")
        background = Background(broker.bootstrap, traffic, rate=60).start()
        for index, worker in enumerate(workers):
            worker.stop()  # restarted with the setting, on its own data dir
            worker.extra_env = {**worker.extra_env, **COOPERATIVE}
            worker.start()
            mixed = index < len(workers) - 1
            protocol = "eager" if mixed else "cooperative"
            assert wait_for(functools.partial(_settled, workers, protocol), 90), (
                f"after restarting {worker.name}: not settled; logs in {tmp_path}"
            )
            if mixed:
                for w in workers[: index + 1]:  # the upgraded ones announce it, the group stays eager
                    assert _protocol(w)["announced"] == "cooperative"
                    assert all(r["protocol"] == "eager" for r in _protocol(w)["rounds"])
        # A second bounce, now cooperative (KIP-429's second one drops the eager protocol; here
        # it is a rolling restart of a cooperative group): the workers not restarted only ever
        # run cooperative rounds, and lose nothing but what the planner moves.
        for worker in workers:
            others = [w for w in workers if w is not worker]
            restarted_at = time.time()
            worker.stop()
            worker.start()
            assert wait_for(lambda: _settled(workers), 90), (
                f"after restarting {worker.name}; logs in {tmp_path}"
            )
            for other in others:
                rounds = _rounds_since(other, restarted_at)
                assert rounds and all(r["protocol"] == "cooperative" for r in rounds), (other.name, rounds)
        switched_at = time.time()
        # One more rebalance of the cooperative group: a worker leaves; the others keep theirs.
        before = {w.name: _actives(w) for w in workers}
        leaving = workers.pop()
        leaving.stop()
        assert wait_for(lambda: _settled(workers), 90), f"not settled after a leave; logs in {tmp_path}"
        sent = background.stop()
        _results(c, sent.expected)
        for worker in workers:
            rounds = _rounds_since(worker, switched_at)
            assert rounds and all(r["protocol"] == "cooperative" for r in rounds), rounds
            assert not {tp for r in rounds for tp in r["revoked"]}, rounds
            assert _input_tps(c, before[worker.name]) <= set(rounds[0]["kept"]), rounds


def test_a_sigkilled_worker_is_taken_over_and_the_others_keep_theirs(
    broker: EmbeddedBroker, unique: str, tmp_path: Path
) -> None:
    with cluster(broker, unique, tmp_path, worker_env=COOPERATIVE) as c:
        workers = [c.worker(f"w{i}", f"host-{i}").start() for i in (1, 2, 3)]
        c.wait_covered(90)
        assert wait_for(lambda: _settled(workers), 60), f"not settled; logs in {tmp_path}"
        traffic = c.traffic(f"r{unique}")
        background = Background(broker.bootstrap, traffic, rate=100).start()
        time.sleep(2)
        before = {w.name: _actives(w) for w in workers}
        victim = workers.pop(0)
        killed_at = time.time()
        victim.kill()
        assert wait_for(lambda: _settled(workers), 90), f"not settled after the kill; logs in {tmp_path}"
        time.sleep(2)
        sent = background.stop()
        _results(c, sent.expected)
        taken = set()
        for worker in workers:
            rounds = _rounds_since(worker, killed_at - 1)
            assert rounds and all(r["protocol"] == "cooperative" for r in rounds), rounds
            assert not {tp for r in rounds for tp in r["revoked"]}, f"{worker.name} revoked: {rounds}"
            assert before[worker.name] <= _actives(worker)
            taken |= _actives(worker) - before[worker.name]
        assert taken == before[victim.name]
