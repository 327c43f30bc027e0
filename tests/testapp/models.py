"""Tables the tests' handlers write into."""

from django.db import models


class Done(models.Model):
    """One row per job a test handler ran to completion (UNIQUE: a second run fails loudly)."""

    job_id = models.CharField(max_length=32, unique=True)
    pid = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.job_id
