"""Every Kafka client Tandem opens is made by assignor/clients.py, with the
connection settings given to it: an AST walk of the framework, the batch side and the
reference app finds every call of a Kafka client constructor; only clients.py may make one.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("tables", "assignor", "pipeline", "app", "examples")
HELPER = ROOT / "assignor" / "clients.py"
# Every way to open a Kafka connection from Python here: aiokafka's clients and connection,
# librdkafka's (confluent-kafka) clients.
CONSTRUCTORS = {
    "AIOKafkaConsumer",
    "AIOKafkaProducer",
    "AIOKafkaAdminClient",
    "AIOKafkaClient",
    "create_conn",
    "AIOKafkaConnection",
    "Consumer",
    "Producer",
    "AdminClient",
}


def constructor_calls(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each call of a constructor named in CONSTRUCTORS, directly or as an
    attribute (`aiokafka.AIOKafkaConsumer(...)`, `confluent_kafka.Consumer(...)`), counting a
    bare `Consumer`/`Producer` only where it was imported from aiokafka or confluent_kafka."""
    tree = ast.parse(path.read_text(), str(path))
    kafka_names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").split(".")[0] in ("aiokafka", "confluent_kafka")
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in CONSTRUCTORS and func.id in kafka_names:
            found.append((node.lineno, func.id))
        elif isinstance(func, ast.Attribute) and func.attr in CONSTRUCTORS:
            owner = ast.unparse(func.value)
            if owner.split(".")[0] in ("aiokafka", "confluent_kafka", "ck"):
                found.append((node.lineno, f"{owner}.{func.attr}"))
    return found


def test_no_kafka_client_is_made_outside_the_helper() -> None:
    bypassing = [
        f"{path.relative_to(ROOT)}:{line} calls {name}"
        for package in SCANNED
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != HELPER
        for line, name in constructor_calls(path)
    ]
    assert not bypassing, "make these with assignor.clients:\n" + "\n".join(bypassing)


def test_the_helper_is_where_clients_are_made_and_the_walk_sees_them() -> None:
    """Not vacuous: the walk finds the helper's own constructors, in both call forms."""
    made = {name for _, name in constructor_calls(HELPER)}
    assert {"AIOKafkaAdminClient", "AIOKafkaClient", "create_conn"} <= made
    assert {"aiokafka.AIOKafkaConsumer", "aiokafka.AIOKafkaProducer"} <= made
