#!/usr/bin/env python3
"""check_metrics.py — scrape a Prometheus /metrics endpoint and validate it (issue 9).

    check_metrics.py URL OUT.json [FAMILY ...]

Parses the exposition with the Prometheus Python client's own parser
(prometheus_client.parser.text_string_to_metric_families, Debian's python3-prometheus-client),
then checks what the parser lets through: every sample belongs to a family with # HELP and
# TYPE, names use the epmoe_ prefix, counters end in _total, histogram buckets are cumulative
and end at le="+Inf" equal to _count, and each FAMILY named on the command line is present.
Writes {family: {labels-as-text: value}} (histograms: their _count) to OUT.json for the caller
to compare scrapes. Exit 0 when valid, 1 with the reasons otherwise, 77 when the parser is not
installed.
"""
import json
import re
import sys
import urllib.error
import urllib.request

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("skip: prometheus_client is not installed (apt install python3-prometheus-client)")
    sys.exit(77)


def fetch(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        ctype = r.headers.get("Content-Type", "")
        return r.status, ctype, r.read().decode("utf-8")


def main():
    url, out = sys.argv[1], sys.argv[2]
    want = sys.argv[3:]
    problems = []
    status, ctype, text = fetch(url)
    if status != 200 or not ctype.startswith("text/plain; version=0.0.4"):
        problems.append("status %d, Content-Type %r" % (status, ctype))
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser's own verdict
        print("FAIL: %s: the Prometheus parser refuses the exposition: %s" % (url, e))
        return 1
    helps = set(re.findall(r"^# HELP (\S+) ", text, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    values = {}
    for f in families:
        name = f.name
        if not name.startswith("epmoe_"):
            problems.append("%s: no epmoe_ prefix" % name)
        tname = name + "_total" if f.type == "counter" and name + "_total" in types else name
        if tname not in helps or tname not in types:
            problems.append("%s: no # HELP or # TYPE" % name)
        if f.type == "counter" and not tname.endswith("_total"):
            problems.append("%s: a counter whose name does not end in _total" % name)
        fam = values.setdefault(tname, {})
        buckets = {}
        for s in f.samples:
            labels = ",".join("%s=%s" % kv for kv in sorted(s.labels.items()) if kv[0] != "le")
            if f.type == "histogram":
                if s.name.endswith("_bucket"):
                    buckets.setdefault(labels, []).append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    fam[labels] = s.value
                    b = buckets.get(labels, [])
                    if not b or b[-1][0] != float("inf") or b[-1][1] != s.value:
                        problems.append("%s{%s}: +Inf bucket differs from _count" % (name, labels))
                    if any(b[i][1] > b[i + 1][1] for i in range(len(b) - 1)):
                        problems.append("%s{%s}: buckets not cumulative" % (name, labels))
            else:
                fam[labels] = s.value
    for w in want:
        if w not in values:
            problems.append("family %s missing" % w)
    try:
        urllib.request.urlopen(url.rsplit("/", 1)[0] + "/nothing", timeout=10)
        problems.append("/nothing did not answer 404")
    except urllib.error.HTTPError as e:
        if e.code != 404:
            problems.append("/nothing answered %d, expected 404" % e.code)
    json.dump(values, open(out, "w"), indent=1, sort_keys=True)
    if problems:
        print("FAIL: %s: %s" % (url, "; ".join(problems[:10])))
        return 1
    print("ok   %s: %d families, %d samples, parsed by prometheus_client" %
          (url, len(families), sum(len(f.samples) for f in families)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
