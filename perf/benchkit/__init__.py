"""What the benchmarks in perf/ share: percentiles, a served run's start and stop, process
memory, the versions a result names, client load, where things are.

The scripts in perf/ import it as `benchkit` (a script's own folder is first on `sys.path`), and
the project's packages (`client`, `omni_backend`, `ensemble_builder`) from its installation
(`pip install -e .`, which `make serve` and `make test` do).
"""
