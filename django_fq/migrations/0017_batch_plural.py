"""The admin names the batch model's list "batches" (it read "Batchs")."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_fq", "0016_history"),
    ]

    operations = [
        migrations.AlterModelOptions(name="batch", options={"verbose_name_plural": "batches"}),
    ]
