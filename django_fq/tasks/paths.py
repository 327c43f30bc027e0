"""Which task paths a worker may import and run: a job's payload never chooses the code.

A Tasks job's payload names its task by dotted path (``"myapp.tasks.send"``).
Anyone who can write a job — a REST producer, ``fq enqueue``, ``fq import`` —
writes that path, so the worker treats it as untrusted input:

1. the path must be a dotted Python name whose module lies inside the package
   of an installed app (``AppConfig.name``, e.g. ``myapp`` covers
   ``myapp.tasks`` and ``myapp.jobs.mail``) or inside a module listed in the
   setting ``FQ_TASK_MODULES``; any other module is refused **without being
   imported** (an import runs module code);
2. the object the path names must be a ``Task`` of the Tasks framework (what
   ``@task`` makes), or a function whose ``Task`` sits in the same module
   under another name; anything else — a plain function, a class, a
   standard-library callable — is refused before it is called.

A refusal raises :class:`TaskRefused`; the task runner turns it into a
``PermanentFailure``, so the job ends dead at once with that message. See
docs/security.md, "What a producer can make a worker do".
"""

from __future__ import annotations

import importlib
from types import ModuleType

from django.conf import settings

from ..validation import dotted_name, task_modules_problem
from . import _compat as tasks

SETTING = "FQ_TASK_MODULES"
#: Longest task path accepted (a payload field; anything longer is not a path of this project).
MAX_PATH_LENGTH = 1000


class TaskRefused(Exception):
    """A task path a worker must not import or run; the message names the path and says why, on one line.

    ``reason`` is the why alone (``enqueue`` words its own error with it).
    """

    def __init__(self, path: object, reason: str):
        shown = path[:200] if isinstance(path, str) else path
        super().__init__(f"task {shown!r} refused: {reason} (a job cannot choose the code a worker runs)")
        self.reason = reason


def task_modules_setting() -> list[str]:
    """``FQ_TASK_MODULES`` as a list of module names (``[]`` when unset).

    Raises :class:`TaskRefused` (every task is refused) when the setting is
    not a list or tuple of dotted module names (system check
    ``django_fq.E008`` reports it).
    """
    value = getattr(settings, SETTING, None)
    if value is None:
        return []
    problem = task_modules_problem(value)
    if problem:
        raise TaskRefused("?", problem)
    return list(value)


def allowed_prefixes() -> list[str]:
    """Module names whose own module and submodules may hold tasks: installed apps, then ``FQ_TASK_MODULES``."""
    from django.apps import apps

    return [app.name for app in apps.get_app_configs()] + task_modules_setting()


def module_allowed(module: str) -> bool:
    """Whether ``module`` (a dotted name) is an installed app's package or module, or one of ``FQ_TASK_MODULES``, or inside one."""
    return any(module == prefix or module.startswith(prefix + ".") for prefix in allowed_prefixes())


def split(path: object) -> tuple[str, str]:
    """``(module, attribute)`` of a task path, checked for shape and place; raises :class:`TaskRefused`.

    Imports nothing.
    """
    if not isinstance(path, str) or not path or len(path) > MAX_PATH_LENGTH or not dotted_name(path) or "." not in path:
        raise TaskRefused(path, "not a dotted path to a module-level task (module.name)")
    module, name = path.rsplit(".", 1)
    try:
        allowed = module_allowed(module)
    except TaskRefused as exc:  # FQ_TASK_MODULES itself is wrong
        raise TaskRefused(path, exc.reason) from None
    if not allowed:
        raise TaskRefused(
            path, f"module {module!r} is neither inside an installed app nor listed in {SETTING}, so it is not imported"
        )
    return module, name


def resolve(path: object) -> tasks.Task:
    """The ``Task`` a job's task path names.

    Raises :class:`TaskRefused` (see the module docstring) for a path that is
    not allowed or does not name a task, and ``ImportError`` when an allowed
    module or its attribute is missing (perhaps a deploy not yet done: the
    job is retried).
    """
    module_name, name = split(path)
    module = importlib.import_module(module_name)
    try:
        target = getattr(module, name)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {name!r}") from None
    if isinstance(target, tasks.Task):
        return target
    found = _task_of(module, target)
    if found is not None:
        return found
    raise TaskRefused(path, f"it is a {type(target).__name__}, not a @task of the Tasks framework")


def _task_of(module: ModuleType, target: object) -> tasks.Task | None:
    """A ``Task`` defined in ``module`` around the function ``target`` (``send = task(_send)``)."""
    if not callable(target):
        return None
    for value in vars(module).values():
        if isinstance(value, tasks.Task) and value.func is target:
            return value
    return None
