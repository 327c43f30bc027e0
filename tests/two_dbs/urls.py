"""URLs of the two-database tests: the admin and the REST API."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/fq/", include("django_fq.api.urls")),
]
