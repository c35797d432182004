"""Gambit's base layer: what every other package needs and that needs nothing above it.

- :mod:`gambit_core.grading`: answer extraction, math-verify equivalence, vote bins;
- :mod:`gambit_core.questions`: question loading (JSONL, local HF datasets, generated sources
  such as the toy world, found through the ``gambit.datasets`` entry points), reading HF
  datasets through :mod:`gambit_core.hf_datasets`;
- :mod:`gambit_core.prompts`: prompt building;
- :mod:`gambit_core.runio`: run I/O (atomic writes, resumable output directories, versions,
  model identity, trace seeds);
- :mod:`gambit_core.registry`: the one registry mechanism (scorer kinds, engines, methods);
- :mod:`gambit_core.cli`: the dataclass-to-argparse helper every console script uses, and
  :class:`gambit_core.errors.InputError`, the one error class for bad input.

The layers above, bottom up: ``gambit_scorer``, ``gambit_search``, ``data_pipelines``
(docs/ARCHITECTURE.md; ``tests/test_architecture.py`` keeps the imports one way).
"""
