"""The report: load (a run folder, once) → build (a pure function) → judge (noise, stored run, gates, exit
code) → outputs (one writer per format). ``pipeline.produce`` runs it; nothing here talks to a server.
The package import is light: numpy and pandas load with ``build``, ``frame`` and ``judge``."""
