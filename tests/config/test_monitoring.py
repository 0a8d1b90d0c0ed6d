"""The files operators import into their own tools (monitoring/): the Prometheus alerting rules
pass `promtool check rules` and their unit tests (`promtool test rules`, series shaped like the
page's), the Grafana dashboard is valid JSON whose queries parse, and every query of either
file names only series that `/metrics` exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from admission.models import Workspace
from admission.runtime import registry as runtime
from admission.services import profiles as services
from config import metrics
from tests.admission.conftest import ALL_CONFIRMED

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "prometheus" / "sluice-alerts.yml"
RULE_TESTS = ROOT / "monitoring" / "prometheus" / "sluice-alerts.test.yml"
DASHBOARD = ROOT / "monitoring" / "grafana" / "sluice-dashboard.json"
SHARED_REDIS = os.environ.get("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/8")

# PromQL words that are neither series nor functions.
_KEYWORDS = {"and", "or", "unless", "bool", "group_left", "group_right", "inf", "nan", "atan2"}
_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count", "count_over_time", "delta", "deriv", "floor", "group",
    "histogram_quantile", "idelta", "increase", "irate", "label_replace", "label_values",
    "last_over_time", "max", "max_over_time", "min", "min_over_time", "quantile",
    "quantile_over_time", "rate", "resets", "round", "scalar", "sort", "sort_desc", "sum",
    "sum_over_time", "time", "timestamp", "topk", "bottomk", "vector",
}  # fmt: skip
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?|[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?")


def series_named(expr: str) -> set[str]:
    """The series a PromQL expression (or a Grafana `label_values(...)` query) names."""
    text = _STRINGS.sub(" ", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\$\w+", " ", text)
    text = re.sub(r"\b(?:offset|@)\s+-?[\w.]+", " ", text)
    if text.lstrip().startswith("label_values"):
        # label_values(series, label): the second argument is a label.
        text = re.sub(r",\s*\w+\s*\)", ")", text)
    named = set()
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token[0].isdigit():
            continue
        word = token.rstrip("( \t\n")
        if word.lower() in _KEYWORDS:
            continue
        if match.group(1):
            function = word
            assert function in _FUNCTIONS, f"unknown PromQL function {function!r} in {expr!r}"
        else:
            named.add(word)
    return named


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def dashboard_queries() -> list[str]:
    board = dashboard()
    queries = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["query"]["query"])
    return queries


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is missing (Debian package prometheus)"
        if os.environ.get("CI") or os.environ.get("SLUICE_STRICT_SKIPS"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def test_alert_rules_pass_promtool_check_and_their_unit_tests():
    tool = promtool()
    checked = subprocess.run(
        [tool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rule_expressions())} rules found" in checked.stdout
    tested = subprocess.run(
        [tool, "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_unit_test_that_sees_it_fire():
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    alerts = {rule["alert"] for group in groups for rule in group["rules"]}
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    silent = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if not case.get("exp_alerts")
    }
    assert alerts - {"SluiceDependencyDown"} <= silent
    assert fired == alerts


def test_dashboard_queries_parse_as_promql(tmp_path):
    # promtool parses each query as a recording rule, Grafana's variables given values.
    tool = promtool()
    rules = []
    for index, query in enumerate(dashboard_queries()):
        if query.startswith("label_values("):
            query = query[len("label_values(") :].rsplit(",", 1)[0]
        expr = query.replace("$__rate_interval", "5m").replace("$provider", ".*")
        rules.append({"record": f"sluice:dashboard_query_{index}", "expr": expr})
    file = tmp_path / "dashboard-queries.yml"
    file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(
        [tool, "check", "rules", str(file)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_dashboard_is_importable_grafana_json():
    board = dashboard()
    assert board["title"] == "Sluice" and board["uid"]
    assert board["templating"]["list"][0] == board["templating"]["list"][0] | {
        "name": "datasource",
        "type": "datasource",
        "query": "prometheus",
    }
    panels = board["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        covered = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and panel["description"], panel["title"]


def test_query_scanner_finds_series_and_nothing_else():
    expr = (
        'histogram_quantile(0.95, sum by (provider, le) (rate(a_bucket{x="b c",le!~"1e3"}[5m])))'
        " / on(provider) group_left sum without (le) (b_total offset 5m) > 1e3 and bool c"
    )
    assert series_named(expr) == {"a_bucket", "b_total", "c"}
    assert series_named("label_values(sluice_admission_limit, provider)") == {
        "sluice_admission_limit"
    }
    with pytest.raises(AssertionError, match="unknown PromQL function 'ratez'"):
        series_named("ratez(x[5m])")


@pytest.fixture
def coordinated_page(settings, django_user_model) -> Iterator[str]:
    """`/metrics` with admission shared in Redis and one active profile: every family it has."""
    prefix = f"mon-{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(SHARED_REDIS)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip(f"no Redis at {SHARED_REDIS}")
    settings.SLUICE_ADMISSION_REDIS_URL = SHARED_REDIS
    settings.SLUICE_ADMISSION_KEY_PREFIX = prefix
    runtime.reset_registry(runtime.build_registry)
    proposer = django_user_model.objects.create_user("pia")
    approver = django_user_model.objects.create_user("abe")
    workspace = Workspace.objects.create(key="acme", name="Acme")
    for user, role in ((proposer, "proposer"), (approver, "operator")):
        workspace.memberships.create(user=user, role=role)
    document = {
        "profileVersion": "acme-v1",
        "workspace": {"concurrency": 4},
        "providers": {"llm": {"concurrency": 2, "maxQueueLength": 8}},
        "principals": {"pat": {"concurrency": 1}},
    }
    version = services.profile_version_propose(
        workspace=workspace, document=document, proposed_by=proposer
    )
    services.profile_version_approve(version=version, approver=approver, checklist=ALL_CONFIRMED)
    services.profile_version_activate(version=version, actor=approver)
    try:
        yield metrics.render().decode()
    finally:
        runtime.reset_registry()
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


def exported(page: str) -> set[str]:
    names = set()
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    for family in text_string_to_metric_families(page):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
    return names


@pytest.mark.django_db
def test_every_query_names_only_series_that_metrics_exports(coordinated_page):
    page = exported(coordinated_page)
    assert "sluice_admission_processes" in page and "sluice_admission_decisions_total" in page
    for source, queries in (("dashboard", dashboard_queries()), ("rules", rule_expressions())):
        for query in queries:
            named = series_named(query)
            assert named, f"{source}: {query!r} names no series"
            assert named <= page, f"{source}: {query!r} names {sorted(named - page)}"
