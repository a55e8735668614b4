"""Prints the real-library suite's results from its JUnit XML: a row per library (cases,
torch mode and shard checks passed; for trainer flows also the fake and promise checks, "-" where
a library has none), then each failure with its class from known_failures.py
("unclassified" for a failure nobody has looked at yet, which is a new finding)."""

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

from known_failures import KNOWN

CHECKS = {"test_torch_mode_equals_eager": "torch mode",
          "test_shards_concatenate_to_the_full_counter_model": "shards",
          "test_every_tensor_is_fake_after_deferred_init": "fake",
          "test_counter_mode_keeps_the_init_promise": "promise"}


def main(path: str) -> None:
    columns = list(CHECKS.values())
    rows = defaultdict(lambda: {**{c: [0, 0] for c in columns}, "cases": set()})
    failures, passing_known = [], []
    for case in ET.parse(path).getroot().iter("testcase"):
        match = re.fullmatch(r"(\w+)\[(.+)\]", case.get("name", ""))
        if not match or match.group(1) not in CHECKS:
            continue
        check, name = CHECKS[match.group(1)], match.group(2)
        row = rows[name.split("/")[0]]
        row["cases"].add(name)
        row[check][1] += 1
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is None:
            row[check][0] += 1
            if (name, check) in KNOWN:
                passing_known.append(f"{name} ({check})")
            continue
        klass = KNOWN.get((name, check), ("unclassified", ""))[0]
        message = (problem.get("message") or "").strip().splitlines()
        failures.append((name, check, klass, " / ".join(message[:3])[:300]))

    def cell(passed: int, run: int, width: int) -> str:
        return f"{f'{passed}/{run}' if run else '-':>{width}}"

    print(f"{'library':<30}{'cases':>6}{'torch mode':>12}{'shards':>10}{'fake':>8}{'promise':>9}")
    widths = (12, 10, 8, 9)
    totals = {c: [0, 0] for c in columns}
    n_cases = 0
    for library in sorted(rows):
        row = rows[library]
        n_cases += len(row["cases"])
        print(f"{library:<30}{len(row['cases']):>6}"
              + "".join(cell(*row[c], w) for c, w in zip(columns, widths)))
        for c in columns:
            totals[c][0] += row[c][0]
            totals[c][1] += row[c][1]
    print(f"{'total':<30}{n_cases:>6}" + "".join(cell(*totals[c], w) for c, w in zip(columns, widths)))
    for name, check, klass, message in failures:
        print(f"FAILED {name} ({check}) [{klass}]: {message}")
    for entry in passing_known:
        print(f"PASSES NOW, remove from known_failures.py: {entry}")


if __name__ == "__main__":
    main(sys.argv[1])
