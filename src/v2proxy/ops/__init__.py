"""Operations: settings, metrics and their recorders, log lines, TLS material.

The settings (command line, environment, config file), the Prometheus metrics and what the edges
record into them, the log lines and the TLS contexts, each read or built once at start-up by the
composition root. Nothing here imports an edge (checked by tools/check_layers.py).
"""
