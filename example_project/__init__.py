"""A small Django site that uses django-fq; ``make demo`` drives it end to end."""
