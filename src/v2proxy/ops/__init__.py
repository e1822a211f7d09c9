"""Operations: settings, metrics and their recorders, log lines, TLS material."""
