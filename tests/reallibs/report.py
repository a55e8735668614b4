"""Prints the real-library suite's results from its JUnit XML: a row per library (cases,
torch mode and shard checks passed), then each failure with its class from known_failures.py
("unclassified" for a failure nobody has looked at yet, which is a new finding)."""

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict

from known_failures import KNOWN

CHECKS = {"test_torch_mode_equals_eager": "torch mode",
          "test_shards_concatenate_to_the_full_counter_model": "shards"}


def main(path: str) -> None:
    rows = defaultdict(lambda: {"torch mode": [0, 0], "shards": [0, 0], "cases": set()})
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

    print(f"{'library':<30}{'cases':>6}{'torch mode':>12}{'shards':>10}")
    totals = [0, 0, 0, 0, 0]
    for library in sorted(rows):
        row = rows[library]
        (tp, tn), (sp, sn) = row["torch mode"], row["shards"]
        print(f"{library:<30}{len(row['cases']):>6}{f'{tp}/{tn}':>12}{f'{sp}/{sn}':>10}")
        for i, v in enumerate((len(row["cases"]), tp, tn, sp, sn)):
            totals[i] += v
    print(f"{'total':<30}{totals[0]:>6}{f'{totals[1]}/{totals[2]}':>12}"
          f"{f'{totals[3]}/{totals[4]}':>10}")
    for name, check, klass, message in failures:
        print(f"FAILED {name} ({check}) [{klass}]: {message}")
    for entry in passing_known:
        print(f"PASSES NOW, remove from known_failures.py: {entry}")


if __name__ == "__main__":
    main(sys.argv[1])
