"""The lease's queue column keeps no foreign-key constraint.

A claim inserts a lease while it holds its jobs' row locks; the constraint's check then took a
key-share lock on the queue row. A configure of a queue with per-key limits holds that row
exclusively (it waits for the queue's enqueues) and then locks the queue's keyed jobs, so the
two waited for each other: a deadlock, retried and under steady claims failing again
(docs/explanation/storage.md "Locks"). The other tables' queue columns already had no
constraint; the lease rows of a queue are deleted with it by django-fq's own statements.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_fq", "0017_batch_plural")]

    operations = [
        migrations.AlterField(
            model_name="lease",
            name="queue",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="leases",
                to="django_fq.queue",
            ),
        ),
    ]
