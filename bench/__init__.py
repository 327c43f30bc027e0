"""django-fq's benchmark suite (not part of the installed package).

Run it with ``python bench/run.py`` from the repository root; see
``docs/performance.md`` for what is measured and how.
"""
