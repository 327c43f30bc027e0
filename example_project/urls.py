"""URLs of the example project: the Django admin (django-fq's pages join it as they land)."""

from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
]
