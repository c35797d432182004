"""gambit-serve: an OpenAI-compatible endpoint that runs the search per request.

- :mod:`~gambit_search.serve.service`: one engine, many searches, the driver on its thread;
- :mod:`~gambit_search.serve.protocol`: request and response bodies;
- :mod:`~gambit_search.serve.app`: the FastAPI endpoints;
- :mod:`~gambit_search.serve.metrics`: ``/metrics``;
- :mod:`~gambit_search.serve.cli`: the ``gambit-serve`` console script.

Design and API: docs/SERVE.md.
"""
