"""``tokenstamp demo``: the seed's experiments, measured through the proxy.

Starts the simulator, the proxy in front of it and the load (``scenarios``),
prints the seed's tables (``report``) and draws the runs (``pictures``);
``--techniques`` runs the seed's map of optimisations (``techniques``, judged by
``claims``, the simulators and their ground truth in ``truth``). It
uses the simulator, the proxy and the exporters; none of them imports it.
"""
