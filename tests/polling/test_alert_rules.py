"""The app's Prometheus alert rules: valid (``promtool check rules``), firing at their
thresholds (``promtool test rules`` on polling.rules.test.yml), and naming only series
that the poller, ``reconcile --metrics-file`` or ``shoal api`` expose.

promtool comes from Debian's ``prometheus`` package, which ``.ci/run`` installs (and
there a missing promtool fails these tests); elsewhere they are skipped, and the run
ends with a line naming the package.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import shoal.api.metrics
from shoal_polling.metrics import PollerMetrics, write_reconciliation
from shoal_polling.reconcile import Reconciliation
from tests.conftest import require_program
from tests.polling.processes import REPO

ALERTS = REPO / "apps" / "polling" / "alerts"
RULES = ALERTS / "polling.rules.yml"
RULE_TESTS = ALERTS / "polling.rules.test.yml"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    path = require_program("promtool", "--no-install-recommends prometheus")
    return subprocess.run(
        [path, *args], cwd=ALERTS, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_rules_are_valid() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout


def test_the_rules_fire_at_their_thresholds() -> None:
    tested = promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def exposed(tmp_path: Path) -> set[str]:
    names: set[str] = set()
    for family in PollerMetrics().registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    prom = tmp_path / "reconcile.prom"
    write_reconciliation(prom, Reconciliation(), at=0.0)
    for family in text_string_to_metric_families(prom.read_text()):
        names.update(s.name for s in family.samples)
    assert shoal.api.metrics.__doc__ is not None
    names.update(re.findall(r"``(shoal_ingest_\w+)``", shoal.api.metrics.__doc__))
    return names


def test_the_rules_name_only_series_that_exist(tmp_path: Path) -> None:
    text = "\n".join(
        line for line in RULES.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    used = set(re.findall(r"\b(shoal_\w+)", text))
    assert {"shoal_ingest_topic_depth", "shoal_polling_sql_timeouts_total"} <= used
    assert used <= exposed(tmp_path), used - exposed(tmp_path)


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings (lower case, spaces to dashes)."""
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_alert_has_a_runbook_of_its_own_in_the_readme() -> None:
    rules = RULES.read_text()
    alerts = re.findall(r"- alert: (\w+)\n(.*?)(?=\n      - alert:|\n  - name:|\Z)", rules, re.S)
    assert len(alerts) >= 10
    readme = REPO / "apps" / "polling" / "README.md"
    anchors = heading_anchors(readme.read_text())
    runbooks = {}
    for name, body in alerts:
        found = re.search(r'runbook: "apps/polling/README\.md#([\w-]+)"', body)
        assert found, f"{name} has no runbook annotation"
        assert found[1] in anchors, f"{name}: no heading #{found[1]} in {readme.name}"
        runbooks[name] = found[1]
    # Each of these means something the others do not: a runbook of its own.
    assert runbooks["PollingTopicOldestMessage"] == "an-old-message-on-a-topic"
    assert runbooks["PollingGatewayErrors"] == "gateway-calls-failing"
    assert runbooks["PollingReconciliationStale"] == "reconciliation-not-running"
