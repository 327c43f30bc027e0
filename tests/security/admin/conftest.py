"""The admin installed for these tests exactly as for ``tests/admin`` (same package-scoped fixture)."""

from tests.admin.conftest import _admin_installed, make_user, queue, root_client  # noqa: F401
