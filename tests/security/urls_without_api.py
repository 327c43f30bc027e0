"""A URL conf without the django-fq REST API (for the DEBUG check)."""

from django.http import HttpResponse
from django.urls import path

urlpatterns = [path("", lambda request: HttpResponse("home"))]
