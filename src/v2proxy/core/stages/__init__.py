"""The pipeline's stages behind one interface (client shared memory, classification).

Each is pure, and the order they run in is in :mod:`v2proxy.core.pipeline`'s docstring.

- :mod:`~v2proxy.core.stages.base`: what a stage is: ``applies`` (cheap; the request's own
  state, or None), ``before`` (what the backend is sent), ``after`` (every response),
  ``release`` (once, whatever happened), and the tensor parameters that make it apply.
- :mod:`~v2proxy.core.stages.chain`: the stages in their order around one backend call: the one
  loop that unary and streamed inference share, and whether any stage applies.
- The stages: :mod:`~v2proxy.core.stages.shm` (client shared memory) and
  :mod:`~v2proxy.core.stages.classification`, composed in this order by the pipeline's
  constructor.

The generate extension (:mod:`~v2proxy.core.generate`) and MindIE's ``/infer``
(``frontends/mindie*.py``, ``codecs/mindie_map.py``) are request *mappings*, not stages, and
stay outside the loop: they turn a request of another protocol (a generate body, a MindIE
request; JSON objects, not an :class:`~v2proxy.core.model.InferRequest`) into an inference and
its responses back into that protocol's answers, and they decide whether there is an inference
at all (a backend with the generate extension is sent the body itself, unmapped). A stage's
``before`` and ``after`` take and give the internal model, so a mapping would fit only by
smuggling its other protocol through them. Instead a mapping sits in front of the loop: it
calls :meth:`Pipeline.stream_infer <v2proxy.core.pipeline.Pipeline.stream_infer>` with the
request it made (MindIE's ``generate`` profile goes through the generate mapping first), and
that request then passes the stages like any other.
"""
