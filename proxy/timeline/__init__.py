"""The live timeline: recent streams, tokens, stalls and prefills, for the eye.

``buffer`` (pure) keeps a bounded picture of the last seconds, ``tokenlog``
(pure) every stamp of recent requests, ``web`` serves the /timeline page and
its SSE feed on the admin port from ``static/``.
"""
