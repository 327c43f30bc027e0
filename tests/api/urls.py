"""URL conf of the API tests: the API where the example project mounts it, and once more elsewhere."""

from django.urls import include, path

urlpatterns = [
    path("api/fq/", include("django_fq.api.urls")),
    path("other/mount/", include("django_fq.api.urls", namespace="fq_api_other")),
]
