"""Finding 2: an evaluation document cannot choose a credential or an endpoint; adapters, their
base URLs and their keys come from the deployment's configuration alone."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from admission.models import Workspace
from console.forms.runs import example_request
from evaluator.deployment import AdapterConfigError, adapter_ids, build_adapters
from evaluator.engine.adapters import FakeAdapter, OpenAIChatAdapter
from evaluator.engine.rulesets import DEPLOYMENT_ONLY_KEYS
from evaluator.models import EvaluationRun

pytestmark = pytest.mark.django_db


@pytest.fixture
def member_client(django_user_model):
    workspace = Workspace.objects.create(key="acme", name="Acme")
    user = django_user_model.objects.create_user(username="mia")
    workspace.members.add(user)
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.mark.parametrize("key", DEPLOYMENT_ONLY_KEYS)
@pytest.mark.parametrize("where", ["primary", "fallbacks[0]"])
def test_a_document_naming_a_secret_or_an_endpoint_is_400_naming_the_field(
    member_client, key, where
):
    document = example_request(1)
    binding = document["ruleset"]["decisions"][0]["binding"]
    value = "DATABASE_URL" if key == "apiKeyEnv" else "http://127.0.0.1:9/steal"
    if where == "primary":
        binding["primary"][key] = value
    else:
        binding["fallbacks"] = [{"adapter": "fake", "model": "m", key: value}]
    response = member_client.post("/api/workspaces/acme/evaluations/", document, format="json")
    assert response.status_code == 400, response.content
    field = f"ruleset.decisions[0].binding.{where}.{key}"
    (message,) = response.json()["error"]["fields"][field]
    assert "come from the deployment's adapter configuration" in message
    assert not EvaluationRun.objects.exists()


def test_per_workspace_adapters_belong_to_their_workspace_only(settings):
    settings.SLUICE_ADAPTERS = {"fake": {"kind": "fake"}}
    settings.SLUICE_WORKSPACE_ADAPTERS = {
        "acme": {
            "llm": {
                "kind": "openai-chat",
                "baseUrl": "https://acme-llm.invalid",
                "apiKeyEnv": "ACME_LLM_KEY",
            }
        }
    }
    assert adapter_ids("acme") == {"fake", "llm"}
    assert adapter_ids("globex") == {"fake"}
    assert adapter_ids() == {"fake"}
    acme = build_adapters("acme")
    assert isinstance(acme["fake"], FakeAdapter)
    assert isinstance(acme["llm"], OpenAIChatAdapter)
    assert repr(acme["llm"]) == (
        "OpenAIChatAdapter(base_url='https://acme-llm.invalid', api_key_env='ACME_LLM_KEY')"
    )
    assert set(build_adapters("globex")) == {"fake"}


@pytest.mark.parametrize(
    ("workspace_adapters", "message"),
    [
        ([], "SLUICE_WORKSPACE_ADAPTERS must map workspace keys"),
        ({"acme": {"llm": "x"}}, "SLUICE_WORKSPACE_ADAPTERS.acme must map adapter ids"),
        (
            {"acme": {"llm": {"kind": "openai-chat", "baseUrl": "https://x", "apiKeyEnv": "A B"}}},
            "apiKeyEnv must be a variable name",
        ),
    ],
)
def test_bad_adapter_configuration_is_a_typed_error(settings, workspace_adapters, message):
    settings.SLUICE_ADAPTERS = {"fake": {"kind": "fake"}}
    settings.SLUICE_WORKSPACE_ADAPTERS = workspace_adapters
    with pytest.raises(AdapterConfigError, match=message):
        build_adapters("acme")
