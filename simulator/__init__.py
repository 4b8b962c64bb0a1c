"""A step-based model of one inference engine, served as an OpenAI-compatible SSE backend.

Continuous batching over an explicit cost model (``simulator.cost``), the seed's
techniques with their costs (``simulator.techniques``; the disaggregated pools in
``simulator.disaggregated``), a pure step planner (``simulator.planner``), an
asyncio engine running it in real time (``simulator.engine``), a vLLM-like HTTP
server (``simulator.server``) and the ``simulate`` subcommand
(``simulator.cli``). The engine records the ground truth (every step, token and
prefill) so tests can score what the proxy sees.
"""
