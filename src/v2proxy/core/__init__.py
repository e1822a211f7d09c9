"""The request's one pass, pure: model, errors, pipeline, stages and ports."""
