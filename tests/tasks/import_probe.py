"""A module no test imports: the C16 tests name it in payloads and check it is never imported.

Importing it would create the file named by ``FQ_C16_IMPORT_MARKER``.
"""

import os

_marker = os.environ.get("FQ_C16_IMPORT_MARKER")
if _marker:
    with open(_marker, "w") as f:
        f.write("imported")


def run(*args, **kwargs):
    return "ran"
