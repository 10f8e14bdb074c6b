"""benchmark/ as a package, so that the project's lab (``benchmark.lab``) imports by one name from
the repository root: ``python -m benchmark.lab.bench``, the tests (tests/conftest.py puts the root
on sys.path) and the scripts here (each puts the root on sys.path). Nothing here is shipped."""
