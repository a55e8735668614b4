"""The failures this suite has found, keyed by (case, check), with the class of issue #11 they
belong to and a minimal repro. The runner labels failures with it; it marks nothing as
expected: a listed failure still fails the run, and report.py names listed cases that pass."""

from typing import Dict, Tuple

KNOWN: Dict[Tuple[str, str], Tuple[str, str]] = {}
