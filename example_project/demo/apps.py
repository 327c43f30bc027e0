"""App config of the demo app."""

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "example_project.demo"
    label = "demo"
    verbose_name = "django-fq demo"
    default_auto_field = "django.db.models.BigAutoField"
