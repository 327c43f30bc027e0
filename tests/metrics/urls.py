"""URLs of the metrics tests: the exporter view where a project would mount it."""

from django.urls import path

from django_fq.metrics.views import metrics_view

urlpatterns = [path("metrics/", metrics_view)]
