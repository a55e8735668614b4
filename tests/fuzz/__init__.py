"""The differential fuzzer: random init programs, eager against deferred_init (docs/fuzzing.md).

``programs`` generates them (seeded, printable as Python source), ``check`` runs one through the
torch-mode, child-first and counter-mode checks, ``python3 -m tests.fuzz`` is the long run.
"""
