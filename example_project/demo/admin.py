"""Admin page listing the recorded welcome emails."""

from django.contrib import admin

from .models import WelcomeEmail


@admin.register(WelcomeEmail)
class WelcomeEmailAdmin(admin.ModelAdmin):
    list_display = ("user_id", "email", "job_id", "sent_at")
    search_fields = ("email", "job_id")
    readonly_fields = ("user_id", "email", "job_id", "sent_at")
