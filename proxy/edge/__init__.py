"""The HTTP edge: the hot path from client to backend and back, and the processes around it.

``app`` is the handler (forward, stamp, map errors), ``relay`` the per-format
relay loops that write each read to the client before the core looks at it,
``state`` what one application owns, ``server`` wires exporters, listeners and
signals, ``admin`` serves /metrics and health. Also the hop-by-hop header
rules, the read watchdog, the heap trimmer and the background task set. It
uses the core and the exporters; the core never imports it.
"""
