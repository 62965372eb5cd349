"""The control plane's ports in memory, and the one place that wires the services over them.

Outside the Lambda layer on purpose: tests, benches and simulations import it, `sam build` never
ships it (import-linter keeps the layer from importing it).
"""
