"""``v2proxy inject``: a mutating admission webhook that adds v2proxy to annotated pods.

- :mod:`.settings`: the sidecar's defaults (the file the chart renders, ``--sidecar-config``)
  and the per-pod ``v2proxy.io/*`` annotations that override them, parsed and checked.
- :mod:`.patch`: pure logic, no I/O: an ``AdmissionReview`` v1 request in, its response out
  (a JSON patch adding the sidecar, the shared ``/dev/shm`` volume and the grace period).
- :mod:`.server`: HTTPS (stdlib ``ssl`` + ``http.server``) serving ``POST /mutate`` and
  ``GET /healthz``; the certificate is re-read when its files change (cert-manager rotation).
"""
