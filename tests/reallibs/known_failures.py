"""The failures this suite has found, keyed by (case, check), with the class of issue #11 (or the
item of issue #29) they belong to and a minimal repro. The runner labels failures with it; it
marks nothing as expected: a listed failure still fails the run, and report.py names listed
cases that pass. Issue 29's (to_empty made real tensors while recording; trunc_normal_ with a
generator left [a, b] in counter mode and ignored the generator's seed) pass since f3511c2 and
a6026d3: tests/python/test_trainer_flows.py keeps their repros."""

from typing import Dict, Tuple

KNOWN: Dict[Tuple[str, str], Tuple[str, str]] = {}
