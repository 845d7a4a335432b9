"""Global-table joins (`join_global`) through the broker-free test driver: the real codecs
and dead letters, the worker's own global-table store (RocksDB files), the real handler.
And the declaration's checks."""

from __future__ import annotations

import itertools
import re
import types
from pathlib import Path
from typing import Any

import faust
import pytest

from tables import JoinDeclarationError, JoinInput, JoinResults, TandemAssignor, join_global
from tables.testing import JoinTestDriver

counter = itertools.count()
README = Path(__file__).resolve().parent.parent / "README.md"


class Product(faust.Record, serializer="json"):
    name: str
    cents: int


class Order(faust.Record, serializer="json"):
    order_id: str
    sku: str
    ts: int


def shop(how: str = "inner", key: Any = "sku") -> tuple[faust.App, Any, dict[str, Any]]:
    """Orders keyed by order id, enriched from products keyed by sku (a field of the order)."""
    app = faust.App(f"global-driver-{next(counter)}", PartitionAssignor=TandemAssignor, web_enabled=False)
    products = app.topic("products", key_type=str, value_type=Product, partitions=3)
    orders = app.topic("orders", key_type=str, value_type=Order, partitions=2)
    out = app.topic("priced", key_type=str, partitions=2)

    @join_global(app, JoinInput(orders, timestamp="ts"), products, key=key, how=how)  # type: ignore[arg-type]
    async def priced(results: JoinResults[str, Order, Product]) -> None:
        async for order_id, order, product, ts in results:
            cents = product.cents if product is not None else None
            await out.send(key=order_id, value={"sku": order.sku, "cents": cents, "ts": ts})

    return app, priced, {"products": products, "orders": orders, "out": out}


async def test_each_order_gets_the_products_value_when_it_is_joined() -> None:
    _, priced, t = shop()
    async with JoinTestDriver(priced) as d:
        await d.send(t["products"], "apple", Product("Apple", 30))
        await d.send(t["products"], "pear", Product("Pear", 50))
        await d.send(t["orders"], "o1", Order("o1", "apple", 1_000), timestamp=1_000)
        await d.send(t["products"], "apple", Product("Apple", 35))  # a new price
        # An order timed before the new price still gets it: the value now, not as of its time.
        await d.send(t["orders"], "o2", Order("o2", "apple", 500), timestamp=500)
        await d.send(t["orders"], "o3", Order("o3", "kiwi", 2_000), timestamp=2_000)  # no such product
        await d.send(t["products"], "pear", None)  # deleted
        await d.send(t["orders"], "o4", Order("o4", "pear", 3_000), timestamp=3_000)
        assert [(s.key, s.value) for s in d.sent(t["out"])] == [
            ("o1", {"sku": "apple", "cents": 30, "ts": 1_000}),
            ("o2", {"sku": "apple", "cents": 35, "ts": 500}),
        ]
        assert d.global_table() == {"apple": Product("Apple", 35)}
        assert d.counters()["results"] == 2


async def test_a_left_join_emits_orders_without_a_product() -> None:
    _, priced, t = shop(how="left")
    async with JoinTestDriver(priced) as d:
        await d.send(t["products"], "apple", Product("Apple", 30))
        await d.send(t["orders"], "o1", Order("o1", "apple", 1_000), timestamp=1_000)
        await d.send(t["orders"], "o2", Order("o2", "kiwi", 2_000), timestamp=2_000)
        results = d.results()
        assert [(r.key, r.right) for r in results] == [("o1", Product("Apple", 30)), ("o2", None)]
        assert d.counters()["unmatched"] == 1


def sku_of(order: Order) -> str | None:
    if order.sku == "boom":
        raise KeyError("no sku")
    return None if order.sku == "none" else order.sku.lower()


async def test_a_key_function_that_raises_dead_letters_the_record_and_none_means_no_key() -> None:
    _, priced, t = shop(how="left", key=sku_of)
    async with JoinTestDriver(priced) as d:
        await d.send(t["products"], "apple", Product("Apple", 30))
        await d.send(t["orders"], "o1", Order("o1", "APPLE", 1_000), timestamp=1_000)
        await d.send(t["orders"], "o2", Order("o2", "boom", 2_000), timestamp=2_000)
        await d.send(t["orders"], "o3", Order("o3", "none", 3_000), timestamp=3_000)
        assert [(r.key, r.right) for r in d.results()] == [("o1", Product("Apple", 30)), ("o3", None)]
        letters = d.dead_letters()
        assert len(letters) == 1, letters
        assert letters[0]["topic"] == "orders" and letters[0]["category"] == "rejected"
        assert "the lookup key function raised KeyError" in letters[0]["reason"]
        assert d.counters()["no_lookup_key"] == 1


async def test_the_table_survives_a_restart_and_is_read_again_after_a_restore() -> None:
    _, priced, t = shop()
    async with JoinTestDriver(priced) as d:
        await d.send(t["products"], "apple", Product("Apple", 30))
        await d.restart()  # on its own files
        await d.send(t["orders"], "o1", Order("o1", "apple", 1_000), timestamp=1_000)
        await d.restore()  # no files: the table read again from its topic
        await d.send(t["orders"], "o2", Order("o2", "apple", 2_000), timestamp=2_000)
        assert [s.key for s in d.sent(t["out"])] == ["o1", "o2"]
        assert d.global_table() == {"apple": Product("Apple", 30)}


def test_the_table_is_no_input_of_the_group() -> None:
    _, priced, _ = shop()
    assert priced.input_topics == ("orders",)  # the group's consumer never reads products
    assert priced.kind.describe() == {"kind": "global", "how": "inner", "table": "products"}


def test_declaration_errors_name_the_problem() -> None:
    with pytest.raises(JoinDeclarationError, match="not a field of Order"):
        shop(key="product")
    with pytest.raises(JoinDeclarationError, match="'inner' or 'left'"):
        shop(how="outer")
    with pytest.raises(JoinDeclarationError, match="name a field of the stream value"):
        shop(key=42)


async def test_the_readme_global_table_example_runs_as_written() -> None:
    """The README's `join_global` example, added to its paid.py, through the test driver."""
    section = README.read_text().split("## Write your own join", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    paid, example = blocks[0], next(b for b in blocks if "join_global" in b)
    module = types.ModuleType("readme_paid")
    exec(
        paid.replace('faust.App("paid"', f'faust.App("readme-paid-{next(counter)}"') + example,
        module.__dict__,
    )
    async with JoinTestDriver(module.order_country) as t:
        await t.send(module.customers, key="c1", value=module.Customer(name="Ann", country="FR"))
        await t.send(module.orders, key=7, value=module.Order(order_id=7, customer="c1", amount_cents=1250))
        await t.send(module.orders, key=8, value=module.Order(order_id=8, customer="c2", amount_cents=990))
        assert [(s.key, s.value) for s in t.sent(module.order_countries)] == [
            (7, {"country": "FR"}),
            (8, {"country": None}),
        ]
