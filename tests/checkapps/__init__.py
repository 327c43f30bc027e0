"""Apps whose ``fq_handlers`` modules misbehave when imported, for the handler-loading check (E006).

``dbapp`` queries a table at import (a cached lookup), ``typoapp`` raises a
NameError. Only ``fq_worker`` and ``check --deploy`` may import them.
"""
