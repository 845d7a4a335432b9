"""Tandem's assignor inside Faust: the adapter, the routing table, and the patches of Faust's
and aiokafka's consumer and group membership the group protocol needs.

    app = faust.App("id", broker=..., PartitionAssignor=TandemAssignor)

| module | what |
| --- | --- |
| `partition_assignor.py` | `TandemAssignor`: Faust's assignor interface, placement by `assignor.plan` |
| `routing.py` | the leader's key-routing table, served to the other members |
| `settings.py` | `TandemSettings`: standby replicas, host, rack, capacity, warm-ups |
| `group.py` | group-membership patches: one JoinGroup, follower SyncGroup delay, rejoin |
| `group_consumer.py` | `TandemConsumer`: Faust's consumer offering the group's protocols, start checks |
| `probes.py` | partition counts and end offsets read from the broker |
| `faust_tables.py` | what Faust tables hold, for warm-ups |
| `web_defaults.py` | pages on 127.0.0.1 and Faust's `/table/` off unless the app says otherwise |

Below it, shared with tables/: `assignor/clients.py` (every Kafka client and its connection
settings), `assignor/log_masking.py` (secrets kept out of log lines) and
`assignor/internals.py` (the pinned versions and the check of every private name Tandem
uses). The join runtime's own consumer patches (records taken whole, commits) and the hook into
Faust's table stores are tables/'s (tables/kafka/consumer.py, table_stores.py).

The names below are this package's public face: what an app, and the join runtime
(tables/), may import from it (tests/test_layers.py checks that tables/ imports no other).
"""

from assignor.faust_adapter.faust_tables import faust_standby_lag
from assignor.faust_adapter.group_consumer import TandemConsumer, TandemConsumerThread, add_start_check
from assignor.faust_adapter.partition_assignor import TandemAssignor, declare_join, install, tandem
from assignor.faust_adapter.probes import broker_partition_counts
from assignor.faust_adapter.routing import RoutingUnavailable, fetch_routing
from assignor.faust_adapter.settings import TandemSettings
from assignor.faust_adapter.web_defaults import apply as apply_web_defaults
from assignor.group_scenario import CopartitionError

__all__ = [
    "CopartitionError",
    "RoutingUnavailable",
    "TandemAssignor",
    "TandemConsumer",
    "TandemConsumerThread",
    "TandemSettings",
    "add_start_check",
    "apply_web_defaults",
    "broker_partition_counts",
    "declare_join",
    "faust_standby_lag",
    "fetch_routing",
    "install",
    "tandem",
]
