"""The per-executor Python worker that owns snapshots and checkpoint storage (docs/protocol.md)."""
