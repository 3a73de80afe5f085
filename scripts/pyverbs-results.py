#!/usr/bin/env python3
"""Results of rdma-core's pyverbs test suite (run_tests.py -v) for scripts/pyverbs.sh.

  pyverbs-results.py parse LOG > RESULTS.tsv
      LOG is run_tests.py's verbose unittest output (stderr). Writes one line per test:
      id <TAB> pass|fail|skip <TAB> detail (skip: the reason; fail: FAIL/ERROR and the last
      line of the traceback). "expected failure" counts as pass, "unexpected success" as fail.
  pyverbs-results.py compare RESULTS.tsv EXPECTED.tsv
      Prints every difference, the expected non-passes by reason and the totals. Exit 1 on an
      unexpected failure: a test expected to pass that failed, skipped or did not report (a
      crash or a hang ends the run early), or a test expected to skip that failed, or a test
      not in EXPECTED that failed. A test expected to fail or skip that now passes is reported
      as newly passing (exit 0).
  pyverbs-results.py update RESULTS.tsv EXPECTED.tsv
      Rewrites EXPECTED from RESULTS, keeping the reasons already written for tests whose
      result did not change; new non-pass lines get the detail as their reason (edit them).

EXPECTED.tsv: `#` comments, then id <TAB> pass|fail|skip <TAB> reason (required unless pass).
"""
import re
import sys

RESULTS = ("pass", "fail", "skip")
HEADER = re.compile(r"^(test\w*) \(([\w.]+)\)(?: \.\.\. (.*))?$")
OUTCOME = re.compile(
    r"(?:^|\.\.\. )(ok|FAIL|ERROR|expected failure|unexpected success|skipped (['\"])(.*)\2)$"
)
FAILURE = re.compile(r"^(ERROR|FAIL): (\w+) \(([\w.]+)\)")
RULE = re.compile(r"^(=|-){70}$")


def clean(text):
    return re.sub(r"\s+", " ", text).strip()[:240]


def outcome(match):
    word = match.group(1)
    if word in ("ok", "expected failure"):
        return "pass", ""
    if word.startswith("skipped"):
        return "skip", clean(match.group(3))
    return "fail", word


def parse(lines):
    """(id -> [result, detail]) in run order."""
    results = {}
    current = None
    for line in lines:
        line = line.rstrip("\n")
        head = HEADER.match(line)
        if head and head.group(2) not in results:
            current = head.group(2)
            results[current] = ["fail", "no result printed"]
            line = "... " + head.group(3) if head.group(3) is not None else ""
        if current:
            found = OUTCOME.search(line)
            if found:
                results[current] = list(outcome(found))
                current = None
    # FAIL/ERROR blocks: the last line of each traceback is the reason.
    block, body = None, []
    for line in lines + ["=" * 70]:
        line = line.rstrip("\n")
        failure = FAILURE.match(line)
        if failure or (RULE.match(line) and line.startswith("=")) or line.startswith("Ran "):
            if block and block in results:
                last = [x for x in body if x.strip() and not RULE.match(x)]
                kind = results[block][1].split(":")[0] or "FAIL"
                if last:
                    results[block][1] = f"{kind}: {clean(last[-1])}"
            block, body = (failure.group(3), []) if failure else (None, [])
            continue
        if block:
            body.append(line)
    return results


def read_tsv(path):
    rows = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) < 2 or parts[1] not in RESULTS:
                sys.exit(f"{path}:{n}: want id<TAB>pass|fail|skip<TAB>reason, got {line!r}")
            reason = parts[2] if len(parts) > 2 else ""
            if parts[1] != "pass" and not reason.strip():
                sys.exit(f"{path}:{n}: {parts[0]}: a {parts[1]} needs a reason")
            rows[parts[0]] = (parts[1], reason)
    return rows


def totals(rows):
    return {r: sum(1 for v in rows.values() if v[0] == r) for r in RESULTS}


def compare(results_path, expected_path):
    got = read_tsv(results_path)
    want = read_tsv(expected_path)
    bad, news, changed = [], [], []
    for test, (result, detail) in got.items():
        exp = want.get(test)
        if exp is None:
            (bad if result == "fail" else news).append(f"{test}: {result} (not in the expectations) {detail}")
        elif result == exp[0]:
            continue
        elif result == "pass":
            news.append(f"{test}: newly passing (expected {exp[0]}: {exp[1]})")
        elif exp[0] == "pass" or result == "fail":
            bad.append(f"{test}: {result}, expected {exp[0]}: {detail}")
        else:
            changed.append(f"{test}: {result}, expected {exp[0]} ({exp[1]}): {detail}")
    for test, (result, reason) in want.items():
        if test not in got:
            line = f"{test}: did not report (expected {result})"
            (bad if result == "pass" else changed).append(line)
    for title, lines in (("UNEXPECTED", bad), ("NEWLY PASSING / NEW", news), ("CHANGED", changed)):
        for line in lines:
            print(f"{title}: {line}")
    reasons = {}
    for test, (result, _) in got.items():
        if result != "pass" and test in want and want[test][0] == result:
            key = (result, want[test][1])
            reasons[key] = reasons.get(key, 0) + 1
    for (result, reason), n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"{n:4} {result}: {reason}")
    t = totals(got)
    e = totals(want)
    print(f"pyverbs on softverbs0: {len(got)} tests: {t['pass']} passed, {t['fail']} failed, "
          f"{t['skip']} skipped (expected: {e['pass']} / {e['fail']} / {e['skip']}); "
          f"{len(bad)} unexpected, {len(news)} newly passing")
    return 1 if bad else 0


def update(results_path, expected_path):
    got = read_tsv(results_path)
    try:
        old = read_tsv(expected_path)
        with open(expected_path) as f:
            head = [line for line in f if line.startswith("#")]
    except FileNotFoundError:
        old, head = {}, []
    with open(expected_path, "w") as f:
        f.writelines(head)
        for test, (result, detail) in got.items():
            reason = ""
            if result != "pass":
                prev = old.get(test)
                reason = prev[1] if prev and prev[0] == result else (detail or "unknown")
            f.write(f"{test}\t{result}\t{reason}\n".replace("\t\n", "\n"))
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "parse":
        with open(argv[2], errors="replace") as f:
            results = parse(f.readlines())
        for test, (result, detail) in results.items():
            print(f"{test}\t{result}\t{detail}")
        return 0
    if len(argv) == 4 and argv[1] == "compare":
        return compare(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "update":
        return update(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
