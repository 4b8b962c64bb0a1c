"""tokenstamp's benchmark: a stamping backend, a bare pass-through, a load generator, the runner.

``tokenstamp bench`` runs the same load directly against the backend and through
each proxy target, and reports per-token transit and each proxy's CPU per token.
"""
