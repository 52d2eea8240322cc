"""Runs a task's unittest files and prints pytest's `-rA` summary, as R2E-Gym's custom runners do for
repositories whose tests are unittest suites (Pillow, Tornado): the grader parses that summary.

Copied into each job's folder and run by the sandbox (`python task_runner.py r2e_tests`): standard
library only, no pytest (the sandbox's interpreter runs without site-packages)."""

import os
import sys
import unittest


def _name(path: str, test: unittest.TestCase) -> str:
    cls, method = type(test).__name__, test.id().rsplit(".", 1)[-1]
    return f"{path}::{cls}::{method}"


def main(folder: str) -> int:
    sys.path.insert(0, os.getcwd())
    rows = []
    for file in sorted(os.listdir(folder)):
        if not (file.startswith("test") and file.endswith(".py")):
            continue
        path = f"{folder}/{file}"
        try:
            suite = unittest.defaultTestLoader.discover(folder, pattern=file, top_level_dir=folder)
        except Exception as exc:  # a test file that does not import: an error, as pytest reports it
            rows.append(f"ERROR {path} - {type(exc).__name__}")
            continue
        tests = list(_tests(suite))  # before the run: a suite drops its tests as it runs them
        result = unittest.TestResult()
        suite.run(result)
        failed = {id(t): ("FAILED", e) for t, e in result.failures}
        failed.update({id(t): ("ERROR", e) for t, e in result.errors})
        for test in tests:
            if isinstance(test, unittest.TestCase) and type(test).__name__ != "_FailedTest":
                status, error = failed.get(id(test), ("PASSED", ""))
                last = error.strip().splitlines()[-1] if error else ""
                rows.append(f"{status} {_name(path, test)}" + (f" - {last}" if last else ""))
            else:
                rows.append(f"ERROR {path} - could not import")
    print("=" * 20 + " short test summary info " + "=" * 20)
    print("\n".join(rows))
    return 0 if all(r.startswith("PASSED") for r in rows) else 1


def _tests(suite: unittest.TestSuite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _tests(item)
        else:
            yield item


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "r2e_tests"))
