"""What the demo handlers write."""

from django.db import models


class WelcomeEmail(models.Model):
    """One row per user who has been sent the welcome email.

    ``user_id`` is UNIQUE: the row is the proof that the email went out, and
    the constraint is what keeps two runs of the same job (or two jobs for the
    same user) from both sending.
    """

    user_id = models.PositiveBigIntegerField(unique=True)
    email = models.EmailField()
    job_id = models.CharField(max_length=64, help_text="the django-fq job that sent it")
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user_id"]

    def __str__(self) -> str:
        return f"welcome email to user {self.user_id} <{self.email}>"
