from django.apps import AppConfig


class EvaluatorConfig(AppConfig):
    name = "evaluator"
    default_auto_field = "django.db.models.BigAutoField"
