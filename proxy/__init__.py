"""tokenstamp: a streaming reverse proxy that stamps every LLM token."""

__version__ = "0.1.0"


def hot_path_build() -> str:
    """``compiled`` when the per-token modules run as mypyc extensions, else ``pure``.

    See ``setup.py``: the compiled build is asked for at install time.
    """
    from proxy.core import timing

    return "pure" if timing.__file__.endswith(".py") else "compiled"
