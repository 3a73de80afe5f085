#!/usr/bin/env python3
"""Per-test results of rdma-core's pyverbs suite (run_tests.py -v), and rxe vs softverbs.

  pyverbs-table.py parse LOG > RESULTS.tsv
      LOG is run_tests.py's verbose unittest output. Writes one line per test, in run order:
      id <TAB> pass|fail|skip <TAB> detail -- the shape of scripts/pyverbs.sh's results.tsv.
      A unittest ERROR is a "fail" whose detail starts with "ERROR" (FAIL: "FAIL"), followed by
      the last line of its traceback; a skip's detail is its reason; "expected failure" counts
      as pass, "unexpected success" as fail, a test that printed no result as fail.
  pyverbs-table.py totals RESULTS.tsv [LABEL]
      One line: tests, pass, fail (FAIL), error (ERROR), skip.
  pyverbs-table.py compare RXE.tsv SOFTVERBS.tsv [EXPECTED.tsv]
      A side-by-side table (every test, its result on rxe and on softverbs) and the totals of
      both. Exit 1 when a test that passes on rxe does not pass on softverbs (fails, skips or
      is missing), unless EXPECTED (scripts/pyverbs.sh's expectations: id <TAB> result <TAB>
      reason) lists it as a non-pass with a reason; such tests are shown as "accepted" with
      the reason. Without EXPECTED no exception is accepted.
  pyverbs-table.py modules RXE.tsv SOFTVERBS.tsv
      A Markdown table, one row per test module (tests.test_mr, ...): pass / fail / error /
      skip on rxe and on softverbs, and how many of rxe's passes pass on softverbs; a totals row.
  pyverbs-table.py selftest
      Checks parse, totals and compare on a built-in sample of unittest's verbose output.

This tool only reads and compares results; it runs nothing.
"""
import re
import sys

HEADER = re.compile(r"^(test\w*) \(([\w.]+)\)(?: \.\.\.(?: (.*))?)?$")
OUTCOME = re.compile(
    r"(?:^|\.\.\. )(ok|FAIL|ERROR|expected failure|unexpected success|skipped (['\"])(.*)\2)$"
)
BLOCK = re.compile(r"^(ERROR|FAIL): (\w+) \(([\w.]+)\)")
RULE = re.compile(r"^[=-]{70}$")


def squash(text):
    """One line of at most 200 characters, safe for a TSV field."""
    return re.sub(r"\s+", " ", text).strip()[:200]


def classify(match):
    """(result, detail) of one unittest outcome."""
    word = match.group(1)
    if word in ("ok", "expected failure"):
        return "pass", ""
    if word.startswith("skipped"):
        return "skip", squash(match.group(3)) or "skipped"
    if word == "unexpected success":
        return "fail", "FAIL: unexpected success"
    return "fail", word


def outcomes(lines):
    """id -> [result, detail] in run order, from the "name (id) ... outcome" lines."""
    results, current = {}, None
    for line in lines:
        head = HEADER.match(line)
        if head and head.group(2) not in results:
            current = head.group(2)
            results[current] = ["fail", "no result printed"]
            line = "... " + head.group(3) if head.group(3) is not None else ""
        found = OUTCOME.search(line) if current else None
        if found:
            results[current] = list(classify(found))
            current = None
    return results


def add_tracebacks(lines, results):
    """Appends the last traceback line of each ERROR/FAIL block to that test's detail."""
    test, body = None, []
    for line in lines + ["=" * 70]:
        block = BLOCK.match(line)
        ends = block or (RULE.match(line) and line.startswith("=")) or line.startswith("Ran ")
        if not ends:
            if test:
                body.append(line)
            continue
        if test in results and results[test][0] == "fail":
            last = [x for x in body if x.strip() and not RULE.match(x)]
            kind = results[test][1].split(":")[0]
            if last:
                results[test][1] = f"{kind}: {squash(last[-1])}"
        test, body = (block.group(3), []) if block else (None, [])


def parse(path):
    with open(path, errors="replace") as f:
        lines = [line.rstrip("\r\n") for line in f]
    results = outcomes(lines)
    add_tracebacks(lines, results)
    return results


def read_tsv(path):
    """id -> (result, detail) of a results or expectations file (# lines are comments)."""
    rows = {}
    with open(path, errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) < 2 or parts[1] not in ("pass", "fail", "skip"):
                sys.exit(f"{path}:{n}: want id<TAB>pass|fail|skip<TAB>detail, got {line!r}")
            rows[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return rows


def kind(row):
    """pass, fail, error or skip; None for a missing row."""
    if row is None:
        return None
    result, detail = row
    if result == "fail" and detail.startswith("ERROR"):
        return "error"
    return result


def totals(rows):
    counts = {k: 0 for k in ("pass", "fail", "error", "skip")}
    for row in rows.values():
        counts[kind(row)] += 1
    return counts


def totals_line(label, rows):
    t = totals(rows)
    return (f"{label}: {len(rows)} tests, {t['pass']} pass, {t['fail']} fail, "
            f"{t['error']} error, {t['skip']} skip")


def verdict(test, rxe, sv, expected):
    """(status, note) of one test: "" (nothing to say), accepted (the reason) or REGRESSION."""
    if kind(rxe.get(test)) != "pass" or kind(sv.get(test)) == "pass":
        return "", ""
    listed = expected.get(test)
    if listed and listed[0] != "pass" and listed[1].strip():
        return "accepted", listed[1]
    row = sv.get(test)
    return "REGRESSION", (f"{row[0]} {row[1]}".strip() if row else "did not report on softverbs")


def compare(rxe_path, sv_path, expected_path=None):
    rxe, sv = read_tsv(rxe_path), read_tsv(sv_path)
    expected = read_tsv(expected_path) if expected_path else {}
    ids = list(rxe) + [t for t in sv if t not in rxe]
    width = max([len(t) for t in ids] + [4])
    print(f"{'test':<{width}}  {'rxe':<6} {'softverbs':<9}  note")
    bad = accepted = 0
    for test in ids:
        status, note = verdict(test, rxe, sv, expected)
        bad += status == "REGRESSION"
        accepted += status == "accepted"
        mark = f"{status}: {note}" if status else ""
        print(f"{test:<{width}}  {kind(rxe.get(test)) or '-':<6} "
              f"{kind(sv.get(test)) or '-':<9}  {mark}".rstrip())
    print()
    print(totals_line("rxe      ", rxe))
    print(totals_line("softverbs", sv))
    both = sum(1 for t in rxe if kind(rxe[t]) == "pass" and kind(sv.get(t)) == "pass")
    rxe_pass = totals(rxe)["pass"]
    only_sv = sum(1 for t in sv if kind(sv[t]) == "pass" and kind(rxe.get(t)) != "pass")
    print(f"of the {rxe_pass} tests rxe passes: {both} pass on softverbs, {accepted} accepted "
          f"(listed in the expectations), {bad} regressions; {only_sv} pass on softverbs only")
    return 1 if bad else 0


def module_of(test):
    """tests.test_mr.MWTest.test_mw_type1 -> test_mr."""
    parts = test.split(".")
    return parts[1] if len(parts) > 2 else parts[0]


def cell(rows):
    t = totals(rows)
    return f"{t['pass']} / {t['fail']} / {t['error']} / {t['skip']}"


def modules(rxe_path, sv_path):
    rxe, sv = read_tsv(rxe_path), read_tsv(sv_path)
    names = sorted({module_of(t) for t in list(rxe) + list(sv)})
    print("| module | rxe pass / fail / error / skip | softverbs pass / fail / error / skip "
          "| rxe passes that pass on softverbs |")
    print("|---|---|---|---|")
    for name in names + [None]:
        r = {t: v for t, v in rxe.items() if name is None or module_of(t) == name}
        v = {t: x for t, x in sv.items() if name is None or module_of(t) == name}
        rp = [t for t in r if kind(r[t]) == "pass"]
        both = sum(1 for t in rp if kind(v.get(t)) == "pass")
        label = f"`{name}`" if name else "**all**"
        print(f"| {label} | {cell(r)} | {cell(v)} | {both} of {len(rp)} |")
    return 0


SAMPLE = """\
test_a (tests.test_x.A.test_a) ... ok
test_b (tests.test_x.A.test_b) ... skipped 'Device does not support UD'
test_c (tests.test_x.A.test_c)
Docstring of test_c ... some output of the test
ERROR
test_d (tests.test_x.A.test_d) ... FAIL
test_e (tests.test_x.A.test_e) ... expected failure
test_f (tests.test_x.A.test_f) ... unexpected success
test_g (tests.test_x.A.test_g) ...
======================================================================
ERROR: test_c (tests.test_x.A.test_c)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "x.py", line 1, in test_c
pyverbs.pyverbs_error.PyverbsRDMAError: Completion status is local QP operation error
======================================================================
FAIL: test_d (tests.test_x.A.test_d)
----------------------------------------------------------------------
AssertionError: 1 != 2
----------------------------------------------------------------------
Ran 7 tests in 0.1s
"""


def selftest():
    """Parses SAMPLE and compares made-up result files; raises AssertionError on a mismatch."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        def write(name, text):
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(text)
            return path

        got = parse(write("log", SAMPLE))
        want = {
            "tests.test_x.A.test_a": ["pass", ""],
            "tests.test_x.A.test_b": ["skip", "Device does not support UD"],
            "tests.test_x.A.test_c": ["fail", "ERROR: pyverbs.pyverbs_error.PyverbsRDMAError: "
                                      "Completion status is local QP operation error"],
            "tests.test_x.A.test_d": ["fail", "FAIL: AssertionError: 1 != 2"],
            "tests.test_x.A.test_e": ["pass", ""],
            "tests.test_x.A.test_f": ["fail", "FAIL: unexpected success"],
            "tests.test_x.A.test_g": ["fail", "no result printed"],
        }
        assert got == want, got
        rows = {t: tuple(v) for t, v in got.items()}
        assert totals(rows) == {"pass": 2, "fail": 3, "error": 1, "skip": 1}, totals(rows)
        rxe = write("rxe", "# c\nt.a\tpass\t\nt.b\tpass\t\nt.c\tskip\twhy\n")
        same = write("sv1", "t.a\tpass\t\nt.b\tpass\t\nt.c\tpass\t\n")
        worse = write("sv2", "t.a\tpass\t\nt.b\tskip\tno UD\n")
        listed = write("exp", "t.b\tskip\tUD is not emulated\n")
        unlisted = write("exp2", "t.b\tpass\t\n")
        quiet = open(os.devnull, "w")
        stdout, sys.stdout = sys.stdout, quiet
        try:
            results = (compare(rxe, same), compare(rxe, worse), compare(rxe, worse, listed),
                       compare(rxe, worse, unlisted), compare(rxe, write("sv3", "t.a\tpass\t\n")))
        finally:
            sys.stdout = stdout
            quiet.close()
        assert results == (0, 1, 0, 1, 1), results
    print("pyverbs-table selftest: ok")
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "parse":
        for test, (result, detail) in parse(argv[2]).items():
            print(f"{test}\t{result}\t{detail}")
        return 0
    if len(argv) in (3, 4) and argv[1] == "totals":
        print(totals_line(argv[3] if len(argv) == 4 else argv[2], read_tsv(argv[2])))
        return 0
    if len(argv) in (4, 5) and argv[1] == "compare":
        return compare(*argv[2:])
    if len(argv) == 4 and argv[1] == "modules":
        return modules(argv[2], argv[3])
    if len(argv) == 2 and argv[1] == "selftest":
        return selftest()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
