"""Tandem's assignor inside Faust: the adapter, the routing table, and the patches of Faust's
and aiokafka's consumer and group membership it needs.

    app = faust.App("id", broker=..., PartitionAssignor=TandemAssignor)

| module | what |
| --- | --- |
| `partition_assignor.py` | `TandemAssignor`: Faust's assignor interface, placement by `assignor.plan` |
| `routing.py` | the leader's key-routing table, served to the other members |
| `settings.py` | `TandemSettings`: standby replicas, host, rack, capacity, warm-ups |
| `internals.py` | the pinned versions and the check of every private name Tandem uses |
| `group.py` | group-membership patches: one JoinGroup, follower SyncGroup delay, rejoin |
| `consumer.py` | Faust's consumer taking join input in whole fetches, start checks |
| `probes.py` | partition counts and end offsets read from the broker |
| `faust_tables.py` | what Faust tables hold, for warm-ups |
| `clients.py` | every Kafka client Tandem opens, and its connection settings (`--client-config`) |
"""

from assignor.faust_adapter.partition_assignor import TandemAssignor, declare_join, install, tandem

__all__ = ["TandemAssignor", "declare_join", "install", "tandem"]
