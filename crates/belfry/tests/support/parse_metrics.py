"""Parses Prometheus text on stdin with prometheus_client's own parser and
prints every sample as one JSON object per line: {"name", "labels", "value"}.
A text the parser refuses makes this exit non-zero."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        print(json.dumps({"name": sample.name, "labels": sample.labels, "value": sample.value}))
