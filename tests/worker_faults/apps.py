from django.apps import AppConfig


class WorkerFaultsConfig(AppConfig):
    """Installs the faults of ``FQ_TEST_WORKER_FAULTS`` once Django is ready (see the package docstring)."""

    name = "tests.worker_faults"
    label = "worker_faults"

    def ready(self) -> None:
        from . import install

        install()
