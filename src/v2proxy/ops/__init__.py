"""Operations: the settings (command line, environment, config file), the Prometheus metrics and
what the edges record into them, the log lines, and the TLS material, each read or built once at
start-up."""
