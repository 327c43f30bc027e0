"""Authentication and permission classes that the API tests plug in through ``FQ_API_*`` settings."""

from __future__ import annotations

from types import SimpleNamespace

from django.contrib.auth.models import User
from rest_framework.authentication import BaseAuthentication, TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from django_fq.api.permissions import HasQueuePermission


class _Tokens:
    """A stand-in for DRF's ``Token`` model: the token of a user is ``"tok-" + username``."""

    class DoesNotExist(Exception):
        pass

    class objects:
        @staticmethod
        def select_related(*_):
            return _Tokens.objects

        @staticmethod
        def get(key):
            user = User.objects.filter(username=key.removeprefix("tok-")).first()
            if not key.startswith("tok-") or user is None:
                raise _Tokens.DoesNotExist
            return SimpleNamespace(key=key, user=user)


class FakeModelTokenAuthentication(TokenAuthentication):
    """DRF's own ``TokenAuthentication`` (``Authorization: Token …``), over :class:`_Tokens`."""

    model = _Tokens


class BodySignatureAuthentication(BaseAuthentication):
    """Reads ``request.body`` before the view does, as HMAC-signature schemes do.

    Reading the body this way applies Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE``
    (``RequestDataTooBig`` for larger bodies). Authenticates ``X-User: name``.
    """

    def authenticate(self, request):
        request._request.body  # noqa: B018 - the read is the point
        name = request.META.get("HTTP_X_USER")
        if not name:
            return None
        user = User.objects.filter(username=name).first()
        if user is None:
            raise AuthenticationFailed("unknown user")
        return (user, None)

    def authenticate_header(self, request):
        return "X-User"


class OwnQueuesOnly(HasQueuePermission):
    """Capabilities apply only to queues named ``<username>:…``."""

    def has_capability(self, user, capability, queue):
        allowed = super().has_capability(user, capability, queue)
        return allowed and (queue is None or queue.startswith(f"{user.get_username()}:"))


class ManageOwnQueuesOnly(HasQueuePermission):
    """``produce`` and ``consume`` on every queue; ``manage`` only on queues named ``<username>:…``."""

    def has_capability(self, user, capability, queue):
        allowed = super().has_capability(user, capability, queue)
        if capability != "manage":
            return allowed
        return allowed and (queue is None or queue.startswith(f"{user.get_username()}:"))
