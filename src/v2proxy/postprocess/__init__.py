"""Post-processing stages of the pipeline, pure (no I/O library): classification."""
