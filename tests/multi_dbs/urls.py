"""URLs of the queues-over-several-databases tests: the admin, the REST API and the metrics view."""

from django.contrib import admin
from django.urls import include, path

from django_fq.metrics.views import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/fq/", include("django_fq.api.urls")),
    path("metrics/", metrics_view),
]
