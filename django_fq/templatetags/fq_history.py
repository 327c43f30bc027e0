"""``{% fq_history queue %}``: the history charts (django_fq.admin.history) where a template includes them.

Used by the dashboard (``admin/django_fq/dashboard_history.html``) and the
queue page (``admin/django_fq/queue/change_form.html``). The span comes from
the request's ``?span=`` (hour, day, week); a bad one is shown as an error
naming the parameter, never raised.
"""

from __future__ import annotations

from django import template

from ..admin import history

register = template.Library()


@register.inclusion_tag("admin/django_fq/history_charts.html", takes_context=True)
def fq_history(context, queue: str | None = None):
    """The charts of ``queue`` (every queue: empty or None) over the request's span."""
    request = context.get("request")
    span = request.GET.get("span") if request is not None else None
    # The page's other parameters (the dashboard's queue, the admin's filters) ride along with the span.
    keep = [(k, v) for k, values in request.GET.lists() if k != "span" for v in values] if request is not None else []
    return {**history.context(queue or None, span), "keep": keep}
