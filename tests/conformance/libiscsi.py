#!/usr/bin/env python3
"""Run libiscsi's iscsi-test-cu against a target and judge the result strictly.

CUnit counts a skipped test as passed. Here a test is a clean pass only if it passed and
printed no "[SKIPPED]" inside its own output; a skip is accepted only if the test is listed
in the expected-skips file (with its justification). Exit status: 0 when no test failed and
every skip was expected, 1 otherwise (a failure is tolerated only when listed in the
expected-failures file as a defect of the test itself, with the reason), 2 when the run itself broke (timeout, crash, no tests).

The last line printed is "N passed, N failed, N skipped"; failed counts real failures (known
test defects are reported on the line before).
"""
import argparse
import json
import re
import subprocess
import sys

TEST_RE = re.compile(r"^\s*Test: (\S+) \.\.\.", re.M)
SUITE_RE = re.compile(r"^Suite: (\S+)", re.M)
# The result token CUnit prints after a test's own output; "[FAILED]" messages are bracketed.
RESULT_RE = re.compile(r"(?<!\[)(passed|FAILED)(?!\])")
SKIP_RE = re.compile(r"\[SKIPPED\]\s*([^\n]*?)\s*(?:passed|FAILED)?\s*$", re.M)
FAIL_MSG_RE = re.compile(r"\[FAILED\][^\n]*")
SUMMARY_RE = re.compile(r"^\s*tests\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", re.M)


def parse(log):
    """Return [(suite.test, outcome, detail)] with outcome pass / fail / skip."""
    suites = [(m.start(), m.group(1)) for m in SUITE_RE.finditer(log)]
    tests = list(TEST_RE.finditer(log))
    results = []
    for i, m in enumerate(tests):
        suite = ""
        for pos, name in suites:
            if pos < m.start():
                suite = name
        end = tests[i + 1].start() if i + 1 < len(tests) else len(log)
        body = log[m.end():end]
        result = RESULT_RE.search(body)
        # Only what the test printed before its result token belongs to it; text after it
        # comes from suite cleanup (e.g. clearing reservations) or the next suite's setup.
        own = body[: result.start()] if result else body
        name = f"{suite}.{m.group(1)}"
        if result is None:
            results.append((name, "fail", "no result printed (crash or timeout?)"))
        elif result.group(1) == "FAILED":
            msgs = FAIL_MSG_RE.findall(own) or ["FAILED"]
            results.append((name, "fail", "; ".join(dict.fromkeys(msgs))))
        elif "[SKIPPED]" in own:
            why = own[own.index("[SKIPPED]") + len("[SKIPPED]"):].strip().splitlines()[0]
            results.append((name, "skip", why))
        else:
            results.append((name, "pass", ""))
    return results


def load_expected(path):
    expected = {}
    if not path:
        return expected
    with open(path) as f:
        for line in f:
            name, _, why = line.partition("#")
            name = name.strip()
            if name:
                expected[name] = why.strip()
    return expected


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--url2", help="second URL (another portal) for the MultipathIO suite")
    ap.add_argument("--test", default="ALL")
    ap.add_argument("--initiator-name")
    ap.add_argument("--initiator-name-2")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--log")
    ap.add_argument("--json")
    ap.add_argument("--expect-skips")
    ap.add_argument("--expect-failures",
                    help="tests known to fail because of a defect in the test itself")
    args = ap.parse_args()

    def command(test, urls):
        cmd = ["iscsi-test-cu", "--dataloss", "--allow-sanitize", f"--test={test}"]
        if args.initiator_name:
            cmd += ["-i", args.initiator_name]
        if args.initiator_name_2:
            cmd += ["-I", args.initiator_name_2]
        return cmd + urls

    # The MultipathIO suite needs the second URL, but with two URLs iscsi-test-cu keeps the
    # second session open across every suite, and tests that take a RESERVE(6) through it
    # (Sanitize.Reservations) never release it, breaking the tests after them on any
    # target. So everything runs through one portal, then MultipathIO through both.
    runs = [command(args.test, [args.url])]
    if args.url2 and args.test in ("ALL", "ALL.MultipathIO") or args.test.startswith("ALL.MultipathIO."):
        mp_test = args.test if "MultipathIO" in args.test else "ALL.MultipathIO"
        runs.append(command(mp_test, [args.url, args.url2]))
    log = ""
    broken = None
    merged = {}
    for i, cmd in enumerate(runs):
        print("$ " + " ".join(cmd), flush=True)
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=args.timeout)
            run_log = proc.stdout.decode("utf-8", "replace")
        except subprocess.TimeoutExpired as e:
            run_log = (e.stdout or b"").decode("utf-8", "replace")
            broken = f"iscsi-test-cu timed out after {args.timeout}s"
        log += run_log
        run_results = parse(run_log)
        summary = SUMMARY_RE.search(run_log)
        run_failed = sum(1 for r in run_results if r[1] == "fail")
        if summary and int(summary.group(4)) > run_failed:
            broken = broken or (f"CUnit reports {summary.group(4)} failures but only "
                                f"{run_failed} were attributed to tests")
        # A later run (MultipathIO through both portals) replaces the first run's results.
        for r in run_results:
            if i == 0 or r[0].startswith("MultipathIO."):
                merged[r[0]] = r
    if args.log:
        with open(args.log, "w") as f:
            f.write(log)
    cmd = [" ".join(c) for c in runs]

    results = list(merged.values())
    expected = load_expected(args.expect_skips)
    passed = [r for r in results if r[1] == "pass"]
    failed = [r for r in results if r[1] == "fail"]
    skipped = [r for r in results if r[1] == "skip"]
    unexpected = [r for r in skipped if r[0] not in expected]
    known_bad = load_expected(args.expect_failures)
    real_failures = [r for r in failed if r[0] not in known_bad]

    by_suite = {}
    for name, outcome, _ in results:
        s = by_suite.setdefault(name.split(".")[0], {"pass": 0, "fail": 0, "skip": 0})
        s[outcome] += 1
    print(f"{'suite':32} {'pass':>5} {'fail':>5} {'skip':>5}")
    for suite, c in by_suite.items():
        print(f"{suite:32} {c['pass']:5} {c['fail']:5} {c['skip']:5}")
    for name, _, detail in failed:
        mark = f" (known test defect: {known_bad[name]})" if name in known_bad else ""
        print(f"FAILED  {name}{mark}: {detail}")
    for name in known_bad:
        if any(r[0] == name and r[1] == "pass" for r in results):
            print(f"NOTE    {name} now passes: remove it from {args.expect_failures}")
    for name, _, detail in skipped:
        mark = "expected" if name in expected else "UNEXPECTED"
        print(f"SKIPPED {name} ({mark}): {detail}")

    if not results:
        broken = broken or "no test ran"
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": cmd, "passed": len(passed), "failed": len(failed),
                       "skipped": len(skipped),
                       "tests": [{"name": n, "outcome": o, "detail": d}
                                 for n, o, d in results]}, f, indent=1)
    if broken:
        print(f"error: {broken}")
    if unexpected:
        print(f"{len(unexpected)} skip(s) not listed in {args.expect_skips}")
    tolerated = len(failed) - len(real_failures)
    if tolerated:
        print(f"{tolerated} failure(s) from known test defects, listed in {args.expect_failures}")
    print(f"{len(passed)} passed, {len(real_failures)} failed, {len(skipped)} skipped")
    if broken:
        return 2
    return 1 if real_failures or unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
