"""Reading reload_runner --report files in the runner tests (see docs/REPORT.md).

Each report lists every rank's parameters with their shape, dtype and CRC-32;
the tests compare two reloads' reports parameter by parameter.
"""
import json


def load(path):
    with open(path) as f:
        return json.load(f)


def parameter_count(report):
    """Parameters over all ranks."""
    return sum(len(r["params"]) for r in report["ranks"])


def differing(a, b):
    """(rank, name) of every parameter whose entry (shape, dtype, CRC-32) differs
    between reports a and b, or that b lacks; a and b must list the same ranks."""
    assert len(a["ranks"]) == len(b["ranks"]), \
        "reports of %d and %d ranks" % (len(a["ranks"]), len(b["ranks"]))
    return [(ra["rank"], name) for ra, rb in zip(a["ranks"], b["ranks"])
            for name, p in ra["params"].items() if p != rb["params"].get(name)]
