"""Tandem's thin Faust adapter: Faust/Kafka state -> scenario -> ``assignor.plan`` -> back.

Apps that declare their joins with `tables.join` get it installed for them. On its
own (docs/assignor-adapter.md)::

    app = faust.App("id", broker=..., PartitionAssignor=TandemAssignor)
    declare_join(app, topics=["impressions", "clicks"], changelog="ads-joins-changelog")
    install(app, local_offsets=lambda: {"ads-joins-changelog": {0: 1200}})

Placement is decided by the pure planner only; this module translates. The
group protocol is offered as ``[tandem, faust]`` so that a group that still has
stock Faust workers keeps working on the stock protocol
(:class:`StockProtocol`), and switches once every member speaks Tandem.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from faust.assignor import PartitionAssignor
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata
from faust.exceptions import ImproperlyConfigured
from faust.tables.manager import TableManager
from faust.types import TP, AppT
from yarl import URL

from assignor import PlanStats, internals, log_masking, plan_with_stats, wire
from assignor.clients import app_settings
from assignor.core.plan import collector_paused
from assignor.faust_adapter import web_defaults
from assignor.faust_adapter.cooperative import blocked_by, install_cooperative
from assignor.faust_adapter.faust_tables import faust_table_offsets
from assignor.faust_adapter.group import delay_follower_sync, install_group_join, request_rejoin
from assignor.faust_adapter.group_consumer import add_start_check, install_consumer
from assignor.faust_adapter.probes import broker_partition_counts, end_offsets
from assignor.faust_adapter.routing import RoutingUnavailable, prefetch, register_view
from assignor.faust_adapter.settings import TandemSettings
from assignor.group_scenario import (
    Join,
    MemberInfo,
    Warmups,
    build_scenario,
    copartition_groups,
    kafka_partitions,
    member_assignments,
    routing_table,
    topic_counts,
    verify_copartitioned,
    with_global_tables,
    with_incoming_warmed,
)
from assignor.internals import check

log = logging.getLogger(__name__)

# What TandemAssignor reads and sets of Faust's own assignor (its __init__ makes them), and of
# Faust's table manager, so that Faust's routing and tables see Tandem's assignment.
internals.require(
    __name__,
    PartitionAssignor,
    "_assignment",
    "_active_tps",
    "_standby_tps",
    "_topic_groups",
    "_tps_url",
    "_external_tps_url",
    "_table_manager",
    instance=True,
)
internals.require(__name__, PartitionAssignor, "changelog_distribution", "external_topic_distribution")
internals.require(__name__, TableManager, "_changelogs", instance=True)

PROTOCOL = "tandem"
STOCK_KEY = "tandem"  # where a Tandem member hides its subscription in stock metadata
ROUNDS_KEPT = 20
LocalOffsets = Callable[[], Mapping[str, Mapping[int, int]]]


@dataclass(frozen=True)
class RebalanceInfo:
    """What the last assignment changed, for the app's view."""

    epoch: int
    protocol: str
    stats: wire.RebalanceStats
    received_at: float


class TandemAssignor(PartitionAssignor):
    """Faust's assignor interface, with placement delegated to ``assignor.plan``."""

    def __init__(self, app: AppT, replicas: int = 0) -> None:
        super().__init__(app, replicas=replicas)
        self.settings = TandemSettings.from_env(defaults={"standby_replicas": replicas})
        self.joins: list[Join] = []
        self.local_offsets: list[LocalOffsets] = []  # each gives topic -> partition -> offset
        self._epoch = 0
        self._own = wire.Assignment()
        self._info: RebalanceInfo | None = None
        self._routing: wire.RoutingTable | None = None
        self.stock = StockProtocol(self)
        # Warm-ups (KIP-441): the leader's changelog end offsets, looked up for each round.
        self._end_offsets: dict[str, dict[int, int]] = {}
        self._lookup: asyncio.Task[dict[str, dict[int, int]]] | None = None
        self._led_epoch = -1  # the epoch this member last planned as the group's leader
        self._probe: asyncio.TimerHandle | None = None  # the periodic probing rebalance
        # Cooperative rounds: what this member still runs until it has released it (its
        # subscription lists it as owned meanwhile), and whether the leader must ask for the
        # follow-up itself (a task revoked from an eager member, which does not ask).
        self._releasing: wire.TopicPartitions = {}
        self._leader_follow_up = False
        self._said_eager = False
        # This member's last rounds as its group coordinator ran them (the view shows them):
        # what it kept running, revoked and was newly given, eager or cooperative.
        self.rounds: deque[dict[str, Any]] = deque(maxlen=ROUNDS_KEPT)

    # ------------------------------------------------------------ what the app reads

    def protocols(self) -> list[Any]:
        """Group protocols in order of preference: ours, then stock Faust's."""
        return [self, self.stock]

    @property
    def cooperative_round(self) -> bool:
        """Whether the group's last round was cooperative: this member then keeps what it runs
        through the next rebalance (assignor/faust_adapter/cooperative.py)."""
        return self._own.cooperative

    @property
    def rebalance_protocol(self) -> str:
        """What the group's last round ran: 'cooperative' or 'eager' (the view shows it)."""
        return "cooperative" if self._own.cooperative else "eager"

    def actives(self) -> dict[str, list[int]]:
        return {t: list(p) for t, p in self._own.active.items()}

    def standbys(self) -> dict[str, list[int]]:
        """Standby replicas, warm-ups not included (see `warmups()`)."""
        return {t: list(p) for t, p in self._own.standby.items()}

    def warmups(self) -> dict[str, list[int]]:
        """Warm-up replicas: changelog partitions to tail like a standby until caught up, when
        the task moves here (Kafka sees them as standbys: `assigned_standbys()` has them)."""
        return {t: list(p) for t, p in self._own.warmup.items()}

    @property
    def pending_moves(self) -> int:
        """Moves the group's last plan holds back until their warm-ups catch up."""
        return self._own.stats.pending

    @property
    def led_last_round(self) -> bool:
        return self._led_epoch == self._epoch and self._epoch > 0

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def own_assignment(self) -> wire.Assignment:
        return self._own

    @property
    def last_rebalance(self) -> RebalanceInfo | None:
        return self._info

    @property
    def routing(self) -> wire.RoutingTable | None:
        """The full partition -> url table: the leader's own, or one fetched from it."""
        return self._routing

    def set_routing(self, table: wire.RoutingTable) -> None:
        if table.epoch >= self._epoch:
            self._routing = table

    # ------------------------------------------------------------ Kafka protocol

    @property
    def name(self) -> str:
        return PROTOCOL

    @property
    def version(self) -> int:
        """Protocol metadata version: tells the leader this member reads warm-up assignments,
        and with TANDEM_REBALANCE_PROTOCOL=cooperative, cooperative rounds."""
        return wire.VERSION_COOPERATIVE if self.runs_cooperative else wire.VERSION_WARMUPS

    @property
    def runs_cooperative(self) -> bool:
        """TANDEM_REBALANCE_PROTOCOL=cooperative, and nothing in the app makes it unsafe (then
        eager, said once): what this member announces to the leader."""
        if not self.settings.cooperative:
            return False
        reasons = blocked_by(self.app)
        if reasons and not self._said_eager:
            self._said_eager = True
            log.warning(
                "tandem: TANDEM_REBALANCE_PROTOCOL=cooperative, but this app rebalances eagerly: %s "
                "(docs/operations.md, 'Cooperative rebalancing')",
                "; ".join(reasons),
            )
        return not reasons

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        data = wire.encode_subscription(self.subscription())
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), data)

    def subscription(self) -> wire.Subscription:
        """This member's own state: what it held, where it runs, what it has on disk."""
        s = self.settings
        return wire.Subscription(
            epoch=self._epoch,
            url=str(self._url),
            host=s.host,
            rack=s.rack,
            capacity=s.capacity,
            previous_active=_merged(self._own.active, self._releasing),
            previous_standby=_merged(self._own.standby, self._own.warmup),  # as the contract asks
            local_offsets=self._read_local_offsets(),
        )

    def _read_local_offsets(self) -> dict[str, dict[int, int]]:
        merged: dict[str, dict[int, int]] = {}
        for source in self.local_offsets:
            try:
                merged.update(offsets_shape(source()))
            except Exception:  # the state store must not keep a worker out of its group
                log.exception("local offsets from %r failed; joining without them", source)
        return merged

    def assign(
        self,
        cluster: ClusterMetadata,
        member_metadata: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        """The leader's plan. Every member's user data is read within the group's limits and
        checked against its real topics; a member whose data is garbage is planned as a member
        with no history, with a warning naming it: no member's bytes make this raise."""
        # Decoding and encoding a thousand members' data allocates many small objects;
        # the cyclic collector would walk the leader's whole heap for them (as in plan()).
        with collector_paused():
            limits = self.wire_limits(cluster, [md.subscription for md in member_metadata.values()])
            members = {m: _member_info(m, md, limits) for m, md in member_metadata.items()}
            return self.assign_members(cluster, members, self._plans_cooperatively(members))

    def _plans_cooperatively(self, members: Mapping[str, MemberInfo]) -> bool:
        """Cooperative when every member says it runs cooperative rounds (its metadata version),
        so one member still on eager makes the round eager (the rolling upgrade: docs/operations.md).
        And when the group's last round was cooperative: its members kept running what they own
        through this rebalance, so a task of theirs may still only move by being revoked first,
        even if an eager member has joined since."""
        if not members:
            return False
        every = all(info.wire_version >= wire.VERSION_COOPERATIVE for info in members.values())
        return every or self._own.cooperative

    def wire_limits(self, cluster: ClusterMetadata, subscriptions: Iterable[Iterable[str]]) -> wire.Limits:
        """The real partition count of every topic this group plans: what bounds and checks
        each member's subscription (assignor/wire.py, `Limits`)."""
        return wire.Limits(self._topic_counts(cluster, {t for sub in subscriptions for t in sub}))

    def _topic_counts(self, cluster: ClusterMetadata, subscribed: set[str]) -> dict[str, int]:
        return topic_counts(
            self.joins,
            subscribed,
            {t: len(cluster.partitions_for_topic(t) or ()) for t in subscribed},
        )

    def assign_members(
        self, cluster: ClusterMetadata, members: Mapping[str, MemberInfo], cooperative: bool = False
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        with collector_paused():
            try:
                return self._assign_members(cluster, members, cooperative)
            except Exception:  # the last line of defence: a plan without history beats no group
                log.exception("tandem: planning with the members' history failed; planning without it")
                fresh = {m: replace(info, state=wire.NO_HISTORY) for m, info in members.items()}
                return self._assign_members(cluster, fresh, cooperative)

    def _assign_members(
        self, cluster: ClusterMetadata, members: Mapping[str, MemberInfo], cooperative: bool = False
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        started = time.monotonic()
        subscribed = {t for info in members.values() for t in info.subscription}
        counts = self._topic_counts(cluster, subscribed)
        # Global tables are everywhere (as in stock Faust): not the planner's business.
        global_counts = {t: counts.pop(t) for t in self.global_changelogs() if t in counts}
        tables = self.table_changelogs()
        groups = copartition_groups(
            self.joins, counts, tables, [members[m].subscription for m in sorted(members)]
        )
        scenario = build_scenario(
            members,
            counts,
            groups,
            tables | self.join_changelogs(),
            self.settings.standby_replicas,
            self.joins,
            self.settings.acceptable_recovery_lag,
            self._warmup_input(),
        )
        if cooperative:  # revoke first, assign in the follow-up (docs/scenario-format.md, C1-C5)
            scenario["protocol"] = "cooperative"
        result = plan_with_stats(scenario)
        planned = result.assignment
        for warning in planned.get("warnings", []):
            log.warning("planner: %s", warning)
        stats = _stats(result.stats, started)
        urls = {m: info.state.url for m, info in members.items() if info.state.url}
        self._routing = routing_table(planned, urls, groups, counts)
        own = member_assignments(planned, members, groups, str(self._url), stats)
        own = {m: with_incoming_warmed(a, tables | self.join_changelogs()) for m, a in own.items()}
        self._led_epoch = int(planned.get("epoch", 0))
        names = {m: info.state.url or info.state.host or m for m, info in members.items()}
        _log_pending(planned, scenario, names)
        _log_revoking(planned, names)
        eager = {m for m, info in members.items() if info.wire_version < wire.VERSION_COOPERATIVE}
        self._leader_follow_up = any(entry["from"] in eager for entry in planned.get("revoking", []))
        return {
            member: self._protocol_assignment(
                wire.for_reader(
                    with_global_tables(own[member], members[member].subscription, global_counts),
                    members[member].wire_version,
                ),
                members[member].subscription,
                tables | set(global_counts),
            )
            for member in members
        }

    def _protocol_assignment(
        self, own: wire.Assignment, subscription: frozenset[str], tables: set[str]
    ) -> ConsumerProtocolMemberAssignment:
        return ConsumerProtocolMemberAssignment(
            self.version,
            kafka_partitions(own, subscription, tables),
            wire.encode_assignment(own),
        )

    # ------------------------------------------------------------ warm-ups and probing

    def _warmup_input(self) -> Warmups | None:
        s = self.settings
        if not s.warmups:
            return None
        ends, self._end_offsets = self._end_offsets, {}  # this round's only
        return Warmups(s.acceptable_recovery_lag, s.max_warmup_replicas, ends)

    def join_starting(self) -> None:
        """Before JoinGroup (consumer thread): the member that led the last round will likely
        lead this one, so it starts the end-offset lookup while the broker holds the join."""
        if self._lookup is not None and self._lookup.done():
            self._lookup = None  # a past round's (this member did not lead it): stale
        if self.settings.warmups and self.led_last_round and self._lookup is None:
            self._lookup = asyncio.ensure_future(self._lookup_end_offsets())
            self._lookup.add_done_callback(_quiet)

    async def prepare_assignment(self) -> None:
        """Before this member plans as the leader: the changelogs' end offsets, bounded in
        time. A slow or failed lookup means "no end offsets" (the planner then uses the highest
        offset any member reports): it never holds up the group round."""
        self._end_offsets = {}
        if not self.settings.warmups:
            return
        task, self._lookup = self._lookup, None
        if task is None:
            task = asyncio.ensure_future(self._lookup_end_offsets())
        budget = self.settings.end_offsets_timeout_ms / 1000
        try:
            self._end_offsets = await asyncio.wait_for(task, budget)
        except Exception as exc:  # TimeoutError, broker errors: plan without them
            log.warning("tandem: no changelog end offsets this round (%r): members' offsets used", exc)

    async def _lookup_end_offsets(self) -> dict[str, dict[int, int]]:
        topics = self.join_changelogs() | self.table_changelogs()
        if not topics:
            return {}
        settings = app_settings(self.app, "probe")
        budget = self.settings.end_offsets_timeout_ms / 1000
        return await end_offsets(settings, topics, self.settings.fetch_high_watermarks, budget)

    def request_probe(self, why: str) -> bool:
        """Ask the group for a rebalance now (a warm-up caught up, or the probing interval)."""
        log.info("tandem: asking for a probing rebalance: %s", why)
        return request_rejoin(self.app)

    def _schedule_probe(self) -> None:
        """The leader of a round that left moves pending asks for a rebalance every probing
        interval (the fallback: members whose warm-up caught up ask at once)."""
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        if not (self.led_last_round and self.pending_moves):
            return
        with contextlib.suppress(RuntimeError):  # no running loop: not in a consumer
            loop = asyncio.get_running_loop()
            self._probe = loop.call_later(
                self.settings.probing_rebalance_interval_s,
                self.request_probe,
                f"{self.pending_moves} move(s) pending for {self.settings.probing_rebalance_interval_s:g} s",
            )

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        try:
            own = wire.decode_assignment(assignment.user_data)
        except wire.WireError as exc:
            # Only a foreign leader sends this; keep what Kafka gave us, without history.
            log.error("unreadable assignment user data (%s); using the bare partitions", exc)
            own = wire.Assignment(active={t: sorted(p) for t, p in assignment.assignment})
        self._adopt(own, PROTOCOL)

    def note_round(
        self,
        generation: int,
        cooperative: bool,
        kept: Iterable[Any],
        revoked: Iterable[Any],
        added: Iterable[Any],
    ) -> None:
        """The coordinator's record of a round on this member (topic-partitions as "topic:p")."""
        self.rounds.append({
            "generation": generation, "epoch": self._epoch, "at": time.time(),
            "protocol": "cooperative" if cooperative else "eager",
            "kept": _tp_names(kept), "revoked": _tp_names(revoked), "newly_assigned": _tp_names(added),
            "pending": _tp_names_of(self._own.incoming), "follow_up": self._own.follow_up,
        })  # fmt: skip

    def cooperative_view(self) -> dict[str, Any]:
        """What the view shows of the protocol: the setting, what this member announces, what
        the group's last round ran, and during a cooperative rebalance the partitions this member
        is releasing (revoked), those it gets in the follow-up (pending) and keeps running."""
        own = self._own
        return {
            "setting": self.settings.rebalance_protocol,
            "announced": "cooperative" if self.runs_cooperative else "eager",
            "group_runs": self.rebalance_protocol,
            "revoked": _tp_names_of(own.revoking),
            "pending": _tp_names_of(own.incoming),
            "kept": _tp_names_of(own.active) if own.cooperative else [],
            "follow_up": own.follow_up,
            "rounds": list(self.rounds),
        }

    def released(self) -> bool:
        """The coordinator has released this round's revoked partitions: whether the group needs
        the follow-up rebalance now (this member revoked something, or, as the leader, planned a
        revocation from a member that does not ask for it)."""
        due = bool(self._releasing) or self._leader_follow_up
        self._releasing, self._leader_follow_up = {}, False
        return due

    def _adopt(self, own: wire.Assignment, protocol: str, keep_distribution: bool = False) -> None:
        """Make Faust's internals (tables, routing, transactions) see this assignment."""
        self._releasing = own.revoking
        self._own = own
        self._epoch = own.epoch
        # Kafka-wise a warm-up is a standby: Faust tails a Faust table's warm-up like one.
        self._assignment = ClientAssignment(actives=own.active, standbys=_merged(own.standby, own.warmup))
        self._active_tps = self._assignment.active_tps
        self._standby_tps = self._assignment.standby_tps
        self._topic_groups = {t: i for i, g in enumerate(own.topic_groups) for t in g}
        if not keep_distribution:
            self._own_distribution(own)
        if self._routing is not None and self._routing.epoch < own.epoch:
            self._routing = None  # stale: the leader keeps the new one
        if self._routing is None and protocol == PROTOCOL:
            prefetch(self, self.app.loop)
        self._info = RebalanceInfo(own.epoch, protocol, own.stats, time.time())
        self._schedule_probe()

    def _own_distribution(self, own: wire.Assignment) -> None:
        # Faust's table_metadata()/key_store() read these maps; Tandem's assignment
        # carries only this member's part (the rest: the routing table).
        tables = self.table_changelogs()
        url = str(self._url)
        self.changelog_distribution = {url: {t: p for t, p in own.active.items() if t in tables}}
        self.external_topic_distribution = {url: {t: p for t, p in own.active.items() if t not in tables}}

    # ------------------------------------------------------------ Faust internals

    def group_for_topic(self, topic: str) -> int:
        # Faust asks this for every keyed send, including topics this group does
        # not consume (stock raises KeyError there); they share one extra group.
        return self._topic_groups.get(topic, len(self._own.topic_groups))

    def key_store(self, topic: str, key: bytes) -> URL:
        return self._owner_url(self.app.producer.key_partition(topic, key))

    def external_key_store(self, topic: str, key: bytes) -> URL:
        return self._owner_url(self.app.producer.key_partition(topic, key))

    def _owner_url(self, tp: TP) -> URL:
        if tp in self._active_tps:
            return URL(str(self._url))
        owner = self._tps_url.get(tp) or self._external_tps_url.get(tp)  # stock protocol
        if owner is None and self._routing is not None:
            owner = self._routing.owner(tp.topic, tp.partition)
        if owner is None:
            raise RoutingUnavailable(
                f"owner of {tp} unknown on this worker: fetch the routing table "
                "(assignor.faust_adapter.routing.fetch_routing) or ask the leader"
            )
        return URL(owner)

    def table_metadata(self, topic: str) -> dict[str, dict[str, list[int]]]:  # type: ignore[override]
        return {url: tps for url, tps in self._by_url({topic}).items() if tps}

    def tables_metadata(self) -> dict[str, dict[str, list[int]]]:  # type: ignore[override]
        return self._by_url(self.table_changelogs())

    def external_topics_metadata(self) -> dict[str, dict[str, list[int]]]:  # type: ignore[override]
        routed = {t for g in (self._routing.groups if self._routing else []) for t in g}
        return self._by_url(routed - self.table_changelogs())

    def _by_url(self, topics: set[str]) -> dict[str, dict[str, list[int]]]:
        """url -> topic -> partitions: the routing table's if known, else the stock maps."""
        if self._routing is None:
            merged = {**self.external_topic_distribution, **self.changelog_distribution}
            return {url: {t: list(p) for t, p in tps.items() if t in topics} for url, tps in merged.items()}
        return self._routing.by_url(topics)

    def table_changelogs(self) -> set[str]:
        return {
            topic
            for topic, table in self._table_manager._changelogs.items()  # type: ignore[attr-defined]
            if not getattr(table, "is_global", False)
        }

    def global_changelogs(self) -> set[str]:
        return {
            topic
            for topic, table in self._table_manager._changelogs.items()  # type: ignore[attr-defined]
            if getattr(table, "is_global", False)
        }

    def join_changelogs(self) -> set[str]:
        return {j.changelog for j in self.joins if j.changelog}


class StockProtocol:
    """The stock ``faust`` protocol, spoken by a Tandem worker during a rolling upgrade.

    Its metadata is stock Faust's, with this member's Tandem subscription added
    under an extra key that stock Faust ignores. A leader of ours that sees that
    key on every member plans with Tandem even under the ``faust`` protocol name:
    some brokers (tansu) keep the protocol a group was created with.
    """

    def __init__(self, tandem: TandemAssignor) -> None:
        self.tandem = tandem

    @property
    def name(self) -> str:
        return "faust"

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        stock = PartitionAssignor.metadata(self.tandem, set(topics))
        body = json.loads(stock.user_data)
        ours = wire.encode_subscription(self.tandem.subscription())
        body[STOCK_KEY] = base64.b64encode(ours).decode("ascii")
        return ConsumerProtocolMemberMetadata(
            stock.version, sorted(topics), json.dumps(body, separators=(",", ":")).encode()
        )

    def assign(
        self,
        cluster: ClusterMetadata,
        member_metadata: Mapping[str, ConsumerProtocolMemberMetadata],
    ) -> Mapping[str, ConsumerProtocolMemberAssignment]:
        with collector_paused():
            limits = self.tandem.wire_limits(cluster, [md.subscription for md in member_metadata.values()])
            ours = {m: _hidden_subscription(m, md, limits) for m, md in member_metadata.items()}
        if all(state is not None for state in ours.values()):
            log.info("every member speaks Tandem: planning with Tandem under the faust protocol")
            members = {
                m: MemberInfo(frozenset(md.subscription), ours[m])  # type: ignore[arg-type]
                for m, md in member_metadata.items()
            }
            return self.tandem.assign_members(cluster, members)
        return self._stock_assign(cluster, member_metadata, limits)

    def _stock_assign(
        self,
        cluster: ClusterMetadata,
        member_metadata: Mapping[str, ConsumerProtocolMemberMetadata],
        limits: wire.Limits,
    ) -> Mapping[str, ConsumerProtocolMemberAssignment]:
        """Stock Faust's plan, with each member's metadata rebuilt from what is valid in it
        (stock Faust trusts it, and raised on 5 garbage payloads of 5); if stock Faust still
        fails, the plan of members without history."""
        clean = {m: _stock_metadata(m, md, limits.counts) for m, md in member_metadata.items()}
        try:
            return PartitionAssignor.assign(self.tandem, cluster, clean)
        except Exception:
            log.exception("tandem: stock Faust's plan failed; planning the members without history")
            fresh = {m: _stock_metadata(m, md, {}) for m, md in member_metadata.items()}
            return PartitionAssignor.assign(self.tandem, cluster, fresh)

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        if wire.is_tandem(assignment.user_data):
            self.tandem.on_assignment(assignment)
            return
        PartitionAssignor.on_assignment(self.tandem, assignment)
        stock = self.tandem._assignment
        own = wire.Assignment(
            active={t: sorted(p) for t, p in stock.actives.items() if p},
            standby={t: sorted(p) for t, p in stock.standbys.items() if p},
            topic_groups=_groups_from_stock(self.tandem._topic_groups),
        )
        # Stock assignments carry the cluster-wide maps Faust's router reads: keep them.
        self.tandem._adopt(own, "faust", keep_distribution=True)


def _log_revoking(planned: Mapping[str, Any], names: Mapping[str, str], shown: int = 10) -> None:
    """The leader's log of a cooperative round's revocations."""
    revoking = planned.get("revoking", [])
    if revoking:
        log.info("tandem: cooperative round: %s task(s) revoked, assigned in the follow-up", len(revoking))
    for entry in revoking[:shown]:
        log.info(
            "tandem: task %s#%s revoked from %s, to %s in the follow-up",
            "+".join(entry["topics"]), entry["partition"], names.get(entry["from"], entry["from"]),
            names.get(entry["to"], entry["to"]),
        )  # fmt: skip


def _member_info(member: str, md: ConsumerProtocolMemberMetadata, limits: wire.Limits) -> MemberInfo:
    """What the leader plans with for one member: its history if its user data is readable
    and true of this group, none otherwise (read_subscription warns, naming the member)."""
    try:
        state, _ = wire.read_subscription(md.user_data, member, limits)
    except Exception as exc:  # read_subscription only raises on a bug: still no member's fault
        log.warning("member %s: unreadable subscription user data (%r); no history", member, exc)
        state = wire.NO_HISTORY
    version = md.version if isinstance(md.version, int) and 0 <= md.version < 2**15 else 0
    return MemberInfo(frozenset(md.subscription), state, version)


def _hidden_subscription(
    member: str, md: ConsumerProtocolMemberMetadata, limits: wire.Limits
) -> wire.Subscription | None:
    """The Tandem subscription a member hides in its stock metadata; None for stock Faust's
    metadata (valid JSON without it). Anything unreadable is a member with no history (stock
    Faust always sends valid JSON), with a warning naming the member."""
    try:
        body = json.loads(md.user_data)
        if not isinstance(body, dict):
            raise ValueError(f"JSON {type(body).__name__}, not an object")
        if STOCK_KEY not in body:
            return None
        hidden = body[STOCK_KEY]
        data = base64.b64decode(hidden, validate=True) if isinstance(hidden, str) else None
        if not data:
            raise ValueError("no base64 text under the Tandem key")
    except Exception as exc:  # bad UTF-8, bad JSON, nesting past the recursion limit, bad base64
        log.warning("member %s: unreadable stock metadata (%s); no history", member, _one_line(exc))
        return wire.NO_HISTORY
    return wire.read_subscription(data, member, limits)[0]


def _one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one short log line (a member's garbage can be long, or hold newlines)."""
    text = repr(exc)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stock_metadata(
    member: str, md: ConsumerProtocolMemberMetadata, counts: Mapping[str, int]
) -> ConsumerProtocolMemberMetadata:
    """Stock Faust metadata holding only what is valid in the member's: its url, and its
    claims on partitions the group's topics have (``counts``). Anything else: no history."""
    actives: dict[str, list[int]] = {}
    standbys: dict[str, list[int]] = {}
    url = ""
    try:
        body = json.loads(md.user_data)
        assignment = body.get("assignment") if isinstance(body, dict) else None
        if isinstance(assignment, dict):
            actives = _stock_claims(assignment.get("actives"), counts)
            standbys = _stock_claims(assignment.get("standbys"), counts)
        found = body.get("url") if isinstance(body, dict) else None
        url = found if isinstance(found, str) and len(found) <= wire.MAX_LABEL else ""
    except Exception as exc:  # bad UTF-8, bad JSON, nesting past the recursion limit
        log.warning("member %s: unreadable stock metadata (%s); no history", member, _one_line(exc))
    metadata = ClientMetadata(
        assignment=ClientAssignment(actives=actives, standbys=standbys),
        url=url,
        changelog_distribution={},
        external_topic_distribution={},
        topic_groups={},
    )
    return ConsumerProtocolMemberMetadata(md.version, list(md.subscription), metadata.dumps())


def _stock_claims(found: Any, counts: Mapping[str, int]) -> dict[str, list[int]]:
    """topic -> partitions claimed, keeping only real partitions of the group's topics."""
    if not isinstance(found, dict):
        return {}
    claims: dict[str, list[int]] = {}
    for topic, partitions in found.items():
        count = counts.get(topic, 0)
        if count and isinstance(partitions, list):
            valid = sorted({p for p in partitions if type(p) is int and 0 <= p < count})
            if valid:
                claims[topic] = valid
    return claims


def _stats(planned: PlanStats, started: float) -> wire.RebalanceStats:
    return wire.RebalanceStats(
        tasks=planned.kept + planned.moved_warm + planned.moved_cold,
        kept=planned.kept,
        moved_warm=planned.moved_warm,
        moved_cold=planned.moved_cold,
        plan_ms=int((time.monotonic() - started) * 1000),
        pending=planned.pending,
        warmups=sum(planned.warmups.values()),
    )


def _tp_names(tps: Iterable[Any]) -> list[str]:
    return sorted(f"{tp.topic}:{tp.partition}" for tp in tps)


def _tp_names_of(partitions: wire.TopicPartitions) -> list[str]:
    return sorted(f"{t}:{p}" for t, ps in partitions.items() for p in ps)


def _quiet(task: asyncio.Future[Any]) -> None:
    """An end-offset lookup nobody waited for: its failure is not news."""
    if not task.cancelled():
        task.exception()


def _merged(first: wire.TopicPartitions, second: wire.TopicPartitions) -> wire.TopicPartitions:
    if not second:
        return first
    merged = {t: set(p) for t, p in first.items()}
    for topic, partitions in second.items():
        merged.setdefault(topic, set()).update(partitions)
    return {t: sorted(p) for t, p in merged.items()}


def _log_pending(
    planned: Mapping[str, Any], scenario: Mapping[str, Any], names: Mapping[str, str], shown: int = 10
) -> None:
    """The leader's log of the moves it holds back (what an operator greps for)."""
    moves = planned.get("pending_moves", [])
    if moves:
        warming = sum(1 for m in moves if m["warmup"])
        log.info("tandem: %s move(s) pending, %s warming up", len(moves), warming)
    for move in moves[:shown]:
        log.info(
            "tandem: task %s#%s stays on %s until %s has caught up (%s; %s)",
            "+".join(move["topics"]), move["partition"], names.get(move["from"], move["from"]),
            names.get(move["to"], move["to"]),
            "warming up" if move["warmup"] else "waiting for a warm-up slot", _target_lag(scenario, move),
        )  # fmt: skip


def _target_lag(scenario: Mapping[str, Any], move: Mapping[str, Any]) -> str:
    """How far the move's target is behind, per changelog partition, as the planner saw it."""
    partition, members = move["partition"], scenario["members"]
    ends = scenario.get("changelog_end_offsets", {})
    parts = []
    for topic in sorted(set(move["topics"]) & set(scenario["changelog_topics"])):
        reported = [m.get("local_offsets", {}).get(topic, {}).get(partition) for m in members.values()]
        end = ends.get(topic, {}).get(partition, max((o for o in reported if o is not None), default=None))
        local = members[move["to"]].get("local_offsets", {}).get(topic, {}).get(partition)
        if local is None or end is None:
            behind = "no offset" if local is None else "end unknown"
        else:
            behind = f"{max(0, end - local):,} behind"
        parts.append(f"{topic}[{partition}] {behind} (end {end})")
    return ", ".join(parts)


def _groups_from_stock(topic_groups: Mapping[str, int]) -> list[list[str]]:
    by_group: dict[int, list[str]] = {}
    for topic, group in sorted(topic_groups.items()):
        by_group.setdefault(group, []).append(topic)
    return [by_group[g] for g in sorted(by_group)]


# ---------------------------------------------------------------- the app's calls


def tandem(app: AppT) -> TandemAssignor:
    """The app's Tandem assignor (the app is built with ``PartitionAssignor=TandemAssignor``)."""
    assignor = app.assignor
    if not isinstance(assignor, TandemAssignor):
        raise ImproperlyConfigured(
            "Tandem needs faust.App(..., "
            "PartitionAssignor='assignor.faust_adapter.partition_assignor:TandemAssignor'), "
            f"not {type(assignor).__name__}"
        )
    return assignor


def declare_join(app: AppT, topics: Iterable[str], changelog: str | None = None) -> Join:
    """Declare a co-partitioned join: partition p of every topic (and the changelog) together."""
    join = Join(tuple(topics), changelog)
    if len(join.all_topics) < 1:
        raise ValueError("a join needs at least one topic")
    joins = tandem(app).joins
    if join not in joins:
        joins.append(join)
    return join


def offsets_shape(found: Any) -> dict[str, dict[int, int]]:
    """Local offsets as changelog topic -> partition -> offset, or a TypeError saying what
    was given instead (a {partition: offset} map would silently report nothing)."""
    if not isinstance(found, Mapping):
        raise TypeError(f"local offsets must map changelog topic -> partition -> offset, not {found!r}")
    shaped: dict[str, dict[int, int]] = {}
    for topic, by_partition in found.items():
        if not isinstance(topic, str) or not isinstance(by_partition, Mapping):
            raise TypeError(
                "local offsets must map changelog topic -> partition -> offset, e.g. "
                f"{{'app-join-changelog': {{0: 1200}}}}; got the entry {topic!r}: {by_partition!r}"
            )
        shaped[topic] = {int(p): int(o) for p, o in by_partition.items()}
    return shaped


def install(
    app: AppT,
    *,
    settings: TandemSettings | None = None,
    local_offsets: LocalOffsets | None = None,
) -> TandemAssignor:
    """Wire Tandem into ``app`` before its worker starts: protocols, settings, local state.

    ``local_offsets()`` returns changelog topic -> partition -> offset of the state on this
    worker's disk; it is called once here, and a wrong shape raises TypeError now."""
    assignor = tandem(app)
    check()
    # Before any page is registered (Faust picks its own endpoints then) and any client connects.
    web_defaults.apply(app)
    log_masking.install()
    log_masking.remember_app(app)
    if settings is not None:
        assignor.settings = settings
    if local_offsets is not None:
        offsets_shape(local_offsets())  # loud at start-up, not silently empty at every rebalance
        if local_offsets not in assignor.local_offsets:
            assignor.local_offsets.append(local_offsets)
    if not any(getattr(s, "faust_tables", False) for s in assignor.local_offsets):
        assignor.local_offsets.append(_FaustTableOffsets(app))
    install_group_join()
    install_cooperative()
    delay_follower_sync(assignor.settings.follower_sync_delay_ms / 1000)
    install_consumer(app, assignor.settings.fetch_max_wait_ms, assignor.settings.fetch_high_watermarks)
    add_start_check(app, functools.partial(_verify_joins, assignor))
    if app.conf.web_enabled:
        register_view(app, assignor)
    return assignor


class _FaustTableOffsets:
    """The local offsets of the app's Faust tables (their changelogs are in the plan too)."""

    faust_tables = True

    def __init__(self, app: AppT) -> None:
        self.app = app

    def __call__(self) -> dict[str, dict[int, int]]:
        return faust_table_offsets(self.app)


async def _verify_joins(assignor: TandemAssignor) -> None:
    """Stop the worker before it joins its group if a declared join is not co-partitioned."""
    if assignor.joins:
        topics = {t for j in assignor.joins for t in j.all_topics}
        verify_copartitioned(
            assignor.joins, await broker_partition_counts(app_settings(assignor.app, "probe"), topics)
        )
