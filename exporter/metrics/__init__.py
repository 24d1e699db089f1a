"""Snapshot -> metric families (pure) -> pre-rendered exposition bytes."""
