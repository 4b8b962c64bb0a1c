"""Incremental stream decoders and chunk interpreters (pure: bytes in, events out)."""
