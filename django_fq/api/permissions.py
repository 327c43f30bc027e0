"""Who may do what: three capabilities, as Django permissions on :class:`django_fq.models.Queue`.

=============  ===========================  ==============================================
capability     permission                   endpoints
=============  ===========================  ==============================================
produce        ``django_fq.produce``        enqueue (one job or a bulk of them) into an
                                            existing queue; wait for a job (its state and
                                            result only)
consume        ``django_fq.consume``        claim, ack, nack, release, extend, progress
manage         ``django_fq.manage``         list/get/configure/delete queues, list/get/
                                            retry/cancel/wait for jobs (the whole job),
                                            stats; create a queue by enqueueing to it
=============  ===========================  ==============================================

Grant them like any permission (groups, the admin, ``user.user_permissions``);
active superusers have all three. Anonymous users have none, so they get
nothing (401 or 403, depending on the first authentication class). The
schema is readable with any one of the three. ``docs/rest-api.md`` has the
table of every endpoint, and ``docs/security.md`` what each capability may learn.

Each view names the capabilities that admit a request (any one of them
suffices) through :func:`required_capabilities`. To restrict by queue, or to
map capabilities to something else (API keys, scopes), subclass
:class:`HasQueuePermission` and override :meth:`~HasQueuePermission.has_capability`,
then list it in ``FQ_API_PERMISSION_CLASSES``. ``queue`` is ``None`` for the
endpoints that are not about one queue (the queue list, which then asks
again for each queue it would show, and the schema)::

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
            self.message = self.refusal(user, needed, queue)
        return False

    def has_capability(self, user, capability: str, queue: str | None) -> bool:
        """Whether ``user`` may act as ``capability`` on ``queue`` (None: not about one queue)."""
        return user.has_perm(PERMISSION_OF[capability])

    def refusal(self, user, needed: tuple[str, ...], queue: str | None) -> str:
        """The message of a 403: what is missing, never a permission the user already holds.

        When the user holds the Django permission and a subclass refused it for
        this queue, the message says the permission does not extend to the queue.
        """
        held = [c for c in needed if HasQueuePermission.has_capability(self, user, c, None)]
        if held and queue is not None:
            names = " or ".join(PERMISSION_OF.get(c, c) for c in held)
            return f"Your permission {names} does not extend to the queue {queue}."
        names = " or ".join(PERMISSION_OF.get(c, c) for c in needed)
        return f"This operation requires the permission {names}."


class _AsIf:
    """A stand-in for a view that requires ``capability`` for the request's method (see :func:`holds`)."""

    def __init__(self, view, method: str, capability: str):
        self.capabilities = {method: (capability,)}
        self.kwargs = dict(getattr(view, "kwargs", {}) or {})
        self.request = getattr(view, "request", None)


def holds(request, view, capability: str, queue: str | None, permissions: list | None = None) -> bool:
    """Whether every permission class of ``view`` would admit ``request`` as ``capability`` on ``queue``.

    Classes with :meth:`HasQueuePermission.has_capability` are asked that;
    any other DRF permission class is asked ``has_permission`` for a stand-in
    view that requires only ``capability``. Used where an answer or a
    side effect depends on a capability beyond the one that admitted the
    request: the whole job in ``wait`` (``manage``), creating a queue by an
    enqueue, and the queues the queue list shows. ``permissions``: the
    instances to ask (default: ``view.get_permissions()``), so a caller asking
    about many queues lets a class cache what it looked up once.
    """
    user = getattr(request, "user", None)
    method = request.method.upper()
    for perm in view.get_permissions() if permissions is None else permissions:
        if isinstance(perm, HasQueuePermission):
            if user is None or not user.is_authenticated or not perm.has_capability(user, capability, queue):
                return False
        else:
            stand_in = _AsIf(view, method, capability)
            if queue is not None:
                stand_in.kwargs["queue"] = queue
            if not perm.has_permission(request, stand_in):
                return False
    return True
