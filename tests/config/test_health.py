"""`/healthz` and `/readyz`: readiness follows the database, the migrations, the broker and the
admission Redis, on private servers that the tests stop and start again."""

from __future__ import annotations

import pytest
from django.test import Client

from config import health
from tests.config.web_process import WebServer, manage, sluice_env
from tests.private_services import PrivatePostgres, PrivateRedis
from tests.service.conftest import wait_for as wait_until


@pytest.fixture(autouse=True)
def _fresh_answers(settings):
    # The kept answer belongs to the process: a test must not see an earlier test's.
    settings.SLUICE_READYZ_CACHE_SECONDS = 0
    health._kept.clear()
    yield
    health._kept.clear()


def _statuses(response) -> dict[str, str]:
    return {name: check["status"] for name, check in response.json()["checks"].items()}


@pytest.fixture
def private_postgres():
    server = PrivatePostgres()
    yield server
    server.destroy()


@pytest.fixture
def private_redis():
    server = PrivateRedis()
    yield server
    server.destroy()


def test_readyz_follows_database_migrations_broker_and_redis(
    tmp_path, private_postgres, private_redis
):
    # The broker's Redis is also the admission Redis, as SLUICE_ADMISSION_REDIS_URL defaults.
    env = sluice_env(
        tmp_path / "var",
        DATABASE_URL=private_postgres.url,
        CELERY_BROKER_URL=private_redis.url,
        SLUICE_HEALTH_TIMEOUT_SECONDS="1",
        # Every probe here must see the servers' state of that moment.
        SLUICE_READYZ_CACHE_SECONDS="0",
    )
    web = WebServer(env, tmp_path / "web.log", "--no-collectstatic")
    try:

        def ready() -> bool:
            return web.get("/readyz").status_code == 200

        fresh = web.get("/readyz")
        assert fresh.status_code == 503
        assert _statuses(fresh) == {
            "database": "ok",
            "migrations": "failing",
            "broker": "ok",
            "redis": "ok",
        }
        assert "not applied" in fresh.json()["checks"]["migrations"]["detail"]

        manage(env, "migrate", "--noinput", "-v", "0")
        answer = web.get("/readyz")
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "ready"
        assert answer.headers["cache-control"] == "no-store"

        private_postgres.stop()
        down = web.get("/readyz")
        assert down.status_code == 503 and down.json()["status"] == "unavailable"
        assert _statuses(down)["database"] == "failing"
        assert _statuses(down)["migrations"] == "failing"
        assert _statuses(down)["broker"] == "ok"
        # The database URL (host, port, user) never reaches the public answer.
        assert str(private_postgres.port) not in down.text
        assert web.get("/healthz").status_code == 200

        private_postgres.start()
        wait_until(ready, 30, "readiness after PostgreSQL came back")

        private_redis.stop()
        broker_down = web.get("/readyz")
        assert broker_down.status_code == 503
        assert _statuses(broker_down) == {
            "database": "ok",
            "migrations": "ok",
            "broker": "failing",
            "redis": "failing",
        }
        private_redis.start()
        wait_until(ready, 30, "readiness after the broker came back")
    finally:
        web.stop()


@pytest.mark.django_db
def test_readyz_follows_an_admission_redis_of_its_own(settings, private_redis):
    # Admission coordinated in a Redis other than the broker's: only that check moves.
    settings.SLUICE_ADMISSION_REDIS_URL = private_redis.url
    settings.SLUICE_HEALTH_TIMEOUT_SECONDS = 1
    # A probe comes from the orchestrator's address, which is no allowed host.
    client = Client(HTTP_HOST="10.0.0.7:8000")

    answer = client.get("/readyz")
    assert answer.status_code == 200, answer.content
    assert _statuses(answer)["redis"] == "ok"

    private_redis.stop()
    down = client.get("/readyz")
    assert down.status_code == 503
    assert _statuses(down)["redis"] == "failing"
    assert down.json()["checks"]["redis"]["detail"].startswith("ConnectionError")

    assert {k: v for k, v in _statuses(down).items() if k != "redis"} == {
        "database": "ok",
        "migrations": "ok",
        "broker": "ok",
    }

    private_redis.start()
    assert client.get("/readyz").status_code == 200


@pytest.mark.django_db
def test_readyz_skips_redis_when_admission_stays_in_process(client, settings):
    settings.SLUICE_ADMISSION_REDIS_URL = ""
    check = client.get("/readyz").json()["checks"]["redis"]
    assert check["status"] == "skipped"
    assert "SLUICE_ADMISSION_REDIS_URL is empty" in check["detail"]


def test_healthz_answers_any_host_and_only_reads(client):
    answer = client.get("/healthz", HTTP_HOST="10.0.0.7")
    assert answer.status_code == 200 and answer.json()["status"] == "ok"
    assert client.head("/healthz/").status_code == 200
    refused = client.post("/readyz")
    assert refused.status_code == 405 and refused["Allow"] == "GET, HEAD"


@pytest.mark.django_db
def test_readyz_keeps_its_answer_briefly_and_reads_the_migration_graph_once(
    settings, django_assert_num_queries, monkeypatch
):
    client = Client()
    first = client.get("/readyz")
    assert first.status_code == 200, first.content

    settings.SLUICE_READYZ_CACHE_SECONDS = 30
    kept = client.get("/readyz")
    with django_assert_num_queries(0):
        again = client.get("/readyz")
    assert again.json() == kept.json()

    # Every migration was found applied once: later checks never build the graph again.
    def no_graph(*args, **kwargs):
        raise AssertionError("the migration graph was read again")

    monkeypatch.setattr(health, "MigrationExecutor", no_graph)
    settings.SLUICE_READYZ_CACHE_SECONDS = 0
    fresh = client.get("/readyz")
    assert fresh.status_code == 200 and _statuses(fresh)["migrations"] == "ok"


def test_readyz_answers_one_address_at_most_its_rate_a_second(settings, monkeypatch):
    settings.SLUICE_READYZ_PER_SECOND = 3
    now = [1000.2]
    monkeypatch.setattr(health, "_readyz_rate", health._PerAddressRate(clock=lambda: now[0]))
    monkeypatch.setattr(health, "readiness", lambda **kwargs: (True, []))
    prober = Client(REMOTE_ADDR="192.0.2.7")
    assert [prober.get("/readyz").status_code for _ in range(4)] == [200, 200, 200, 429]
    refused = prober.get("/readyz")
    assert refused["Retry-After"] == "1" and refused.json()["error"]["type"] == "throttled"
    # Another address has its own count; the next second starts a new one.
    assert Client(REMOTE_ADDR="192.0.2.8").get("/readyz").status_code == 200
    now[0] = 1001.0
    assert prober.get("/readyz").status_code == 200
    # Liveness is never throttled.
    assert all(prober.get("/healthz").status_code == 200 for _ in range(10))
