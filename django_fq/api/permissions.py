"""Who may do what: three capabilities, as Django permissions on :class:`django_fq.models.Queue`.

=============  ===========================  ==============================================
capability     permission                   endpoints
=============  ===========================  ==============================================
produce        ``django_fq.produce``        enqueue (one job or a bulk of them); wait for a
                                            job
consume        ``django_fq.consume``        claim, ack, nack, release, extend
manage         ``django_fq.manage``         list/get/configure/delete queues, list/get/
                                            retry/cancel/wait for jobs, stats
=============  ===========================  ==============================================

Grant them like any permission (groups, the admin, ``user.user_permissions``);
active superusers have all three. Anonymous users have none, so they get
nothing (401 or 403, depending on the first authentication class). The
schema is readable with any one of the three.

Each view names the capabilities that admit a request (any one of them
suffices) through :func:`required_capabilities`. To restrict by queue, or to
map capabilities to something else (API keys, scopes), subclass
:class:`HasQueuePermission` and override :meth:`~HasQueuePermission.has_capability`,
then list it in ``FQ_API_PERMISSION_CLASSES``::

    class PerQueue(HasQueuePermission):
        def has_capability(self, user, capability, queue):
            # e.g. permission "django_fq.produce" plus membership of group "queue:<name>"
            return super().has_capability(user, capability, queue) and (
                queue is None or user.groups.filter(name=f"queue:{queue}").exists()
            )
"""

from __future__ import annotations

from rest_framework.permissions import BasePermission

PRODUCE, CONSUME, MANAGE = "produce", "consume", "manage"
CAPABILITIES = (PRODUCE, CONSUME, MANAGE)
#: Django permission name (``app_label.codename``) of each capability.
PERMISSION_OF = {c: f"django_fq.{c}" for c in CAPABILITIES}


def required_capabilities(view, request) -> tuple[str, ...]:
    """The capabilities of which any one admits ``request`` to ``view`` (empty: nobody)."""
    table = getattr(view, "capabilities", {}) or {}
    method = request.method.upper()
    if method == "HEAD":
        method = "GET"
    if method in table:
        return tuple(table[method])
    # OPTIONS, or a method the endpoint lacks: any capability it knows of admits
    # the request (which then gets the endpoint's description, or 405).
    return tuple(dict.fromkeys(c for caps in table.values() for c in caps))


class HasQueuePermission(BasePermission):
    """Admit an authenticated user holding any capability the endpoint requires."""

    message = "You do not have the django-fq permission this operation requires."

    def has_permission(self, request, view) -> bool:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return False
        needed = required_capabilities(view, request)
        queue = getattr(view, "kwargs", {}).get("queue")
        if any(self.has_capability(user, c, queue) for c in needed):
            return True
        if needed:
            names = " or ".join(PERMISSION_OF.get(c, c) for c in needed)
            self.message = f"This operation requires the permission {names}."
        return False

    def has_capability(self, user, capability: str, queue: str | None) -> bool:
        """Whether ``user`` may act as ``capability`` on ``queue`` (None: not about one queue)."""
        return user.has_perm(PERMISSION_OF[capability])
