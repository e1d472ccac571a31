"""Name -> object registries for ``-algo``, ``-m``, ``--select`` and ``--engine``.

Entries register themselves with a decorator when their module is imported (as timm does);
a duplicate name is an error rather than a silent override, and an unknown name lists the
known ones so that a typo on the command line is answered with the right spelling.
"""
from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Callable, Generic, Iterator, TypeVar

from utils.errors import FLError

T = TypeVar("T")


class Registry(Generic[T]):
    """A case-sensitive mapping from public names to registered objects."""

    def __init__(self, kind: str, flag: str):
        self.kind = kind
        self.flag = flag
        self._entries: dict[str, T] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator registering an object under ``name`` (and optional aliases)."""

        def decorator(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._entries and self._entries[key] is not obj:
                    raise RuntimeError(f"{self.kind} name {key!r} is registered twice")
                self._entries[key] = obj
            # vars(), not hasattr: a subclass must not inherit its parent's registered name.
            if "registered_name" not in vars(obj):
                try:
                    obj.registered_name = name  # type: ignore[attr-defined]
                except (AttributeError, TypeError):
                    pass
            return obj

        return decorator

    def get(self, name: str) -> T:
        """The object registered as ``name``; an FLError listing the known names otherwise."""
        if name in self._entries:
            return self._entries[name]
        folded = {key.lower(): key for key in self._entries}
        if name.lower() in folded:
            return self._entries[folded[name.lower()]]
        close = difflib.get_close_matches(name, list(self._entries), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise FLError(
            f"unknown {self.kind} {name!r} for {self.flag}{hint}; known: {', '.join(self.names())}"
        )

    def names(self) -> list[str]:
        return sorted(self._entries, key=str.lower)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


ALGORITHMS: Registry = Registry("algorithm", "-algo")
MODELS: Registry = Registry("model", "-m")
SELECTORS: Registry = Registry("client selection policy", "--select")
ENGINES: Registry = Registry("training engine", "--engine")
#: round plug-ins (flcore/features): features of a round that are not the algorithm's
PLUGINS: Registry = Registry("round plug-in", "the run's flags")
#: local-step strategies (flcore/clients/localstep.py): how a client computes one SGD step
LOCAL_STEPS: Registry = Registry("local step", "the run's flags")
#: label types (flcore/objectives.py): a sample's label, its loss and its metrics
OBJECTIVES: Registry = Registry("label type", 'config.json\'s "label_type"')

register_algorithm = ALGORITHMS.register
register_model = MODELS.register
register_selector = SELECTORS.register
register_engine = ENGINES.register
register_plugin = PLUGINS.register
register_local_step = LOCAL_STEPS.register


def import_submodules(package: str) -> None:
    """Import every module of ``package`` so that their decorators fill the registries."""
    module = importlib.import_module(package)
    for info in pkgutil.iter_modules(module.__path__):
        importlib.import_module(f"{package}.{info.name}")


def load_all() -> None:
    """Fill every registry: models, selection policies, engines, plug-ins, local steps and algorithms."""
    import_submodules("flcore.trainmodel")
    import_submodules("flcore.features")
    import_submodules("flcore.features.privacy")
    import_submodules("flcore.selectors")
    import_submodules("flcore.engines")
    import_submodules("flcore.servers")


def list_algorithms() -> list[str]:
    load_all()
    return ALGORITHMS.names()


def list_models() -> list[str]:
    load_all()
    return MODELS.names()
