"""tokenstamp: a streaming reverse proxy that stamps every LLM token."""

__version__ = "0.1.0"
