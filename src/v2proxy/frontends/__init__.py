"""Frontends: each decodes one client wire form into the internal model and encodes the answer
back. A frontend never knows which backend is behind the pipeline."""
