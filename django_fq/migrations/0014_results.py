"""Results flow forward: a dependency edge may carry a name (docs/how-to/workflows.md "Results flow forward").

``Dependency.name`` is the key under which the dependent reads its
dependency's result (``job.upstream[name]``); the workflow builder writes the
name of the step the edge comes from. Nullable, so adding it rewrites no row.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0013_batches"),
    ]

    operations = [
        migrations.AddField(
            model_name="dependency",
            name="name",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
    ]
