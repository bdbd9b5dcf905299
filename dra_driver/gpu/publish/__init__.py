"""What the node publishes: inventory -> DRA devices (+ partitions and counters) -> the pool."""
