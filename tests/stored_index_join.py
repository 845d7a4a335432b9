"""The join with its index stored in RocksDB, as the tests and benchmarks name it: it was this
file's own (the operator before its index moved to memory, commit c0fe567) and is now the
framework's `TANDEM_WINDOW_INDEX=rocksdb` operator (tables/operators/stored_window.py). Tests
drive it and tables.operators.windowed.WindowedJoin over the same records and compare every
result, changelog record and stored record (tests/test_tables_index.py), and
benchmarks/bench_operator.py measures one against the other.
"""

from tables.operators.stored_window import EXPIRY, ID, StoredIndexJoin, id_key, index_bounds, index_key

__all__ = ["EXPIRY", "ID", "StoredIndexJoin", "id_key", "index_bounds", "index_key"]
