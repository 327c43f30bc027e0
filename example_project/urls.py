"""URLs of the example project: the Django admin (django-fq's pages join it as they land)."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The REST API (docs/rest-api.md): /api/fq/queues/..., schema at /api/fq/schema/.
    path("api/fq/", include("django_fq.api.urls")),
]
